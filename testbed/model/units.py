"""Units in one place: rates, durations, loss ratios.

Users write tc-style strings ("100mbit", "5ms", "0.1%"); the kernel wants bytes per
second, microseconds and fractions of 2**32. Every conversion happens in the types
below, so no other module multiplies by 8 or 1000.

Rates use tc's decimal prefixes: 1kbit = 1000 bit/s, 1mbit = 10**6 bit/s. tc reads
"mbps" as megaBYTES per second while most people mean megabits, so "bps" suffixes are
refused with a hint instead of being guessed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_TIME_UNITS = {"us": 1, "ms": 1000, "s": 1_000_000}
_NUM = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # ASCII digits: float() would also read "１００"

MIN_RATE_BPS = 8_000  # 8 kbit/s: below that HTB's token arithmetic degenerates
MAX_RATE_BPS = 400 * 10**9  # HTB's 64-bit rate handles more; beyond this is a typo


class UnitError(ValueError):
    """A value could not be parsed; ``str()`` says what is accepted."""


def _fmt_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True, order=True)
class Rate:
    """A link rate in bits per second (layer 2, as tc counts it)."""

    bps: int

    @classmethod
    def parse(cls, value: object) -> "Rate":
        if isinstance(value, Rate):
            return value
        if isinstance(value, bool) or not isinstance(value, str):
            raise UnitError(
                f"{value!r} has no unit; write a rate such as '100mbit', '1gbit' or '500kbit'"
            )
        s = value.strip().lower()
        if re.fullmatch(_NUM, s):
            raise UnitError(f"'{value}' has no unit; write e.g. '{s}mbit' (tc units: bit, kbit, mbit, gbit, tbit)")
        m = re.fullmatch(_NUM + r"\s*([a-z]+)", s)
        if not m:
            raise UnitError(f"'{value}' is not a rate; write e.g. '100mbit', '1gbit', '500kbit'")
        num, unit = float(m.group(1)), m.group(2)
        if unit.endswith("bps") or unit in ("b", "kb", "mb", "gb", "k", "m", "g", "kbits", "mbits", "gbits"):
            raise UnitError(
                f"'{value}' is ambiguous (tc reads 'mbps' as megabytes per second); "
                f"write bits per second as '{m.group(1)}mbit' style: bit, kbit, mbit, gbit, tbit"
            )
        if unit not in _RATE_UNITS:
            raise UnitError(f"'{value}': unknown rate unit '{unit}'; use one of: {', '.join(_RATE_UNITS)}")
        bps = num * _RATE_UNITS[unit]
        if not (math.isfinite(bps) and MIN_RATE_BPS <= round(bps) <= MAX_RATE_BPS):
            raise UnitError(f"'{value}' is outside the supported range 8kbit..400gbit")
        return cls(round(bps))

    @property
    def bytes_per_second(self) -> int:
        return self.bps // 8

    def __str__(self) -> str:
        for unit in ("tbit", "gbit", "mbit", "kbit"):
            f = _RATE_UNITS[unit]
            if self.bps >= f and self.bps % (f // 1000 or 1) == 0:
                return f"{_fmt_number(self.bps / f)}{unit}"
        return f"{self.bps}bit"


@dataclass(frozen=True, order=True)
class Duration:
    """A delay or jitter in microseconds (netem's unit)."""

    us: int

    @classmethod
    def parse(cls, value: object) -> "Duration":
        if isinstance(value, Duration):
            return value
        if value == 0 and not isinstance(value, bool):
            return cls(0)
        if isinstance(value, bool) or not isinstance(value, str):
            raise UnitError(f"{value!r} has no unit; write a duration such as '5ms', '200us' or '1s'")
        s = value.strip().lower()
        if s == "0":
            return cls(0)
        if re.fullmatch(_NUM, s):
            raise UnitError(f"'{value}' has no unit; write e.g. '{s}ms' (units: us, ms, s)")
        m = re.fullmatch(_NUM + r"\s*(us|ms|s)", s)
        if not m:
            raise UnitError(f"'{value}' is not a duration; write e.g. '5ms', '250us', '1s'")
        us = float(m.group(1)) * _TIME_UNITS[m.group(2)]
        if us > 60_000_000:
            raise UnitError(f"'{value}' is longer than 60s; that is almost certainly a typo")
        return cls(round(us))

    @property
    def seconds(self) -> float:
        return self.us / 1e6

    def __bool__(self) -> bool:
        return self.us != 0

    def __str__(self) -> str:
        if self.us == 0:
            return "0"
        if self.us % 1_000_000 == 0:
            return f"{self.us // 1_000_000}s"
        if self.us % 1000 == 0 or self.us >= 10_000:
            return f"{_fmt_number(self.us / 1000)}ms"
        return f"{self.us}us"


@dataclass(frozen=True, order=True)
class Loss:
    """A packet loss probability, stored as a percentage in [0, 100]."""

    percent: float

    @classmethod
    def parse(cls, value: object) -> "Loss":
        if isinstance(value, Loss):
            return value
        if value == 0 and not isinstance(value, bool):
            return cls(0.0)
        if isinstance(value, bool) or not isinstance(value, str):
            raise UnitError(f"{value!r} is ambiguous; write loss as a percentage such as '0.1%'")
        s = value.strip()
        m = re.fullmatch(_NUM + r"\s*%", s)
        if not m:
            raise UnitError(f"'{value}' is not a loss; write a percentage such as '0.1%' or '2%'")
        p = float(m.group(1))
        if not (0.0 <= p <= 100.0) or math.isnan(p):
            raise UnitError(f"'{value}' is outside 0%..100%")
        return cls(p)

    @property
    def fraction(self) -> float:
        return self.percent / 100.0

    def __bool__(self) -> bool:
        return self.percent != 0.0

    def __str__(self) -> str:
        return f"{_fmt_number(self.percent)}%"
