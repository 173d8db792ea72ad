"""``testbed run --dilation auto``: find a K at which the emulation no longer measures this
machine, and run at it.

A run at K = 1, then 2, 4, 8, ... (or from ``auto:FIRST-LAST``'s FIRST; each a whole run of its own, ``RUN_ID-k1``, ``-k2``, ...)
until two successive K give median iteration times (in emulated seconds) within
``TOLERANCE`` of each other: the machine's own overheads no longer move the result, so the
larger K is *validated* (a ``--gpu-time`` run, whose real compute is held to K x T, also
needs both runs free of overruns: every iteration's compute met its deadlines). The last run is the result; its summary keeps the curve
(``dilation_curve``: K, median iteration seconds, run id) and ``dilation_validated``. When
the ladder's last K (64 for plain ``auto``) is reached without agreement the last run is kept, marked not validated, and
the curve says how far it got.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from testbed.common.files import write_json
from testbed.runs.dilation import Auto
from testbed.runs.request import RunRequest, new_run_id

TOLERANCE = 0.05
"""Two successive K agree when their median iteration times differ by at most 5 %."""


def agree(a: float, b: float, tolerance: float = TOLERANCE) -> bool:
    """Median iteration times ``a`` (at K) and ``b`` (at 2K) agree: |b - a| <= tolerance x a."""
    return a > 0 and abs(b - a) <= tolerance * a


def run_auto(req: RunRequest, run_one: Callable[[RunRequest], dict], say: Callable[[str], None],
             auto: Auto = Auto()) -> dict:
    """Runs of ``req`` at K = ``auto``'s ladder (1, 2, 4, ...; ``run_one`` makes one, as
    testbed.runs.experiment.run does) until two successive ones agree; the last one's
    summary, with the curve."""
    base = req.run_id or new_run_id(req.out, req.scheme, req.bw)
    curve: list[dict] = []
    summary: dict = {}
    validated = False
    for k in auto.ladder():
        say(f"--dilation auto: a run at K = {k:g}")
        summary = run_one(replace(req, dilation=k, run_id=f"{base}-k{k:g}", spec=req.spec))
        curve.append({"k": k, "median_iter_s": summary.get("median_iter_s"), "run_id": summary["run_id"],
                      "overruns": summary.get("overruns")})
        if len(curve) >= 2 and _agree(curve[-2], curve[-1]):
            validated = True
            break
    last = curve[-1]
    verdict = (f"validated: K = {curve[-2]['k']:g} and {last['k']:g} agree within {TOLERANCE:.0%}" if validated else
               f"not validated: no two successive K up to {last['k']:g} agreed within {TOLERANCE:.0%}")
    say(f"--dilation auto: {verdict} ({', '.join(_point(c) for c in curve)})")
    summary.update(dilation_validated=validated, dilation_curve=curve, dilation_tolerance=TOLERANCE)
    write_json(Path(summary["run_dir"]) / "summary.json", summary)
    return summary


def _agree(a: dict, b: dict) -> bool:
    """Two successive runs agree, and (a --gpu-time run) neither overran its budget."""
    x, y = a["median_iter_s"], b["median_iter_s"]
    return isinstance(x, (int, float)) and isinstance(y, (int, float)) and agree(x, y) \
        and not a.get("overruns") and not b.get("overruns")


def _point(c: dict) -> str:
    t = c["median_iter_s"]
    return f"K {c['k']:g}: {t * 1000:.1f} ms" if isinstance(t, (int, float)) else f"K {c['k']:g}: -"
