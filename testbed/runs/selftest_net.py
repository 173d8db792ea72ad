"""`testbed selftest`'s network rows: TCP goodput against the configured rate, a live rate
change, netem delay and loss. Each step returns one row (:func:`row`).

The measurements are iperf3 between the two workers of the self-test's dumbbell (w0 ->
w1 across the shaped link s0-s1), started as cross-traffic is (:mod:`testbed.runs.traffic`):
every iperf3 carries ``--logfile=<dir>/traffic-N-ROLE.log``, recorded in the testbed's
ledger before it starts, so ``down`` stops any a Ctrl-C or ``kill -9`` left behind.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import read_text
from testbed.model.units import Duration, Loss, Rate
from testbed.runs.traffic import parse_server_log

GOODPUT_MIN = 0.85
"""Lowest goodput/rate a goodput row passes at. TCP over an exact layer-2 shaper gives 0.956
of the rate at MTU 1500 (the rest is TCP/IP/Ethernet headers); below 0.85 the host (CPU,
a shaper that cannot keep up) costs more than a tenth of the link, and runs measured on it
would blame the network for the machine."""
GOODPUT_MAX = 1.05
"""Highest goodput/rate a goodput row passes at: goodput cannot exceed the rate, so above
1.05 (more than the 5 % measuring noise of a few seconds) the link is not shaped as told."""
GOODPUT_RATES = ("50mbit", "200mbit", "1gbit")
GOODPUT_SECONDS = 3
"""Seconds measured per rate, after one second of slow start that iperf3 omits (-O 1)."""
GOODPUT_TRIES = 2
"""A busy CPU can only lower goodput, so a row below GOODPUT_MIN is measured once more."""
CHANGE = ("500mbit", "100mbit")
"""The live change: a flow runs at the first rate, the link is set to the second meanwhile."""
CHANGE_SETTLE_S = 1.0
"""The seconds after the change that are not judged (the queue built at the old rate drains)."""
DELAY = "10ms"
"""netem delay set in each direction: the round trip is twice it."""
DELAY_LOW = 0.95
DELAY_SLACK_MS = 3.0
"""The delay row passes when the median round trip is within [0.95 x 2 x DELAY, 2 x DELAY
+ 3 ms]: netem never delays less than asked, and more than a few ms beyond it is the host's
scheduling, which would show up in every collective as latency the topology does not have."""
LOSS = "2%"
LOSS_RANGE = (1.0, 3.0)
"""The loss row's pass range (percent lost of ~3000 UDP datagrams at 2 %: about 4 standard
deviations either side of 2 %)."""
PORT = 5401
SERVER, CLIENT = "w1", "w0"


def row(check: str, expected: str, measured: str, verdict: str, detail: str = "", **data) -> dict:
    """One row of the self-test's table. ``verdict``: pass, fail or skip; ``data``: the raw numbers."""
    assert verdict in ("pass", "fail", "skip"), verdict
    return {"check": check, "expected": expected, "measured": measured, "verdict": verdict, "detail": detail,
            "data": data}


def within(value: float, low: float, high: float) -> str:
    return "pass" if low <= value <= high else "fail"


def goodput_verdict(ratio: float) -> str:
    """pass when measured goodput / configured rate is within [GOODPUT_MIN, GOODPUT_MAX]."""
    return within(ratio, GOODPUT_MIN, GOODPUT_MAX)


def mbit(bps: float) -> str:
    return f"{bps / 1e6:.1f} Mbit/s"


class Iperf:
    """iperf3 tests from CLIENT to SERVER in testbed ``tb``; logs in ``workdir``."""

    def __init__(self, tb, workdir: Path):
        self.tb, self.dir, self.n = tb, workdir.resolve(), 0
        self.procs: list[subprocess.Popen] = []

    @staticmethod
    def missing() -> str | None:
        """Why no iperf3 test can run here, or None."""
        if shutil.which("iperf3") is None:
            return "iperf3 is not installed (apt-get install iperf3)"
        return None

    def _spawn(self, node: str, argv: list[str]) -> subprocess.Popen:
        from testbed.plan.actions import StartTraffic
        from testbed.plan.ledger import Ledger

        marker = next(a for a in argv if a.startswith("--logfile="))
        ledger = Ledger(self.tb.name)
        with ledger.lock():
            ledger.record(StartTraffic(marker).to_dict())
        p = self.tb.spawn(node, argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def start(self, client_args: list[str], seconds: float) -> tuple[subprocess.Popen, Path, Path]:
        """Start a one-off server (its log: per-second reports) and a client with ``client_args``
        (its log: iperf3's JSON); returns the client and both logs."""
        i, self.n = self.n, self.n + 1
        addr, port = self.tb.address(SERVER), str(PORT + i)
        slog, clog = self.dir / f"traffic-{i}-server.log", self.dir / f"traffic-{i}-client.log"
        server = self._spawn(SERVER, ["iperf3", "-s", "-1", "-p", port, "-B", addr, "-i", "1", "--forceflush",
                                      "--timestamps=%s ", f"--logfile={slog}"])
        self._await(server, slog, "Server listening", 10)
        client = self._spawn(CLIENT, ["iperf3", "-c", addr, "-p", port, "-B", self.tb.address(CLIENT), "-J",
                                      "-t", str(seconds), *client_args, f"--logfile={clog}"])
        return client, slog, clog

    def run(self, client_args: list[str], seconds: float) -> dict:
        """One test to its end: the client's JSON result."""
        client, _, clog = self.start(client_args, seconds)
        return self.result(client, clog, seconds)

    def result(self, client: subprocess.Popen, clog: Path, seconds: float) -> dict:
        try:
            client.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            raise TestbedError(f"iperf3 did not finish a {seconds} s test within {seconds + 30} s") from None
        try:
            res = json.loads(read_text(clog, "records", "iperf3 result"))
        except (OSError, ValueError, TestbedError) as e:
            raise TestbedError(f"iperf3 wrote no result ({getattr(e, 'message', e)})") from None
        if not isinstance(res, dict) or res.get("error"):
            raise TestbedError(f"iperf3 failed: {res.get('error') if isinstance(res, dict) else res!r}")
        return res

    @staticmethod
    def _await(p: subprocess.Popen, log: Path, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.exists() and text in log.read_text(errors="replace"):
                return
            if p.poll() is not None:
                break
            time.sleep(0.05)
        raise TestbedError(f"the iperf3 server in {SERVER} did not start: {Iperf._tail(log)}")

    @staticmethod
    def _tail(log: Path) -> str:
        try:
            return log.read_text(errors="replace").strip()[-300:] or "(nothing logged)"
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.procs.clear()


def _set(tb, **shape) -> None:
    tb.set_links(tb.find_links(bottleneck=True), **shape)


def goodput_row(tb, iperf: Iperf, rate: str) -> dict:
    """TCP goodput across the shaped link at ``rate``, against the rate."""
    check, expected = f"TCP goodput at {rate}", f"{GOODPUT_MIN}-{GOODPUT_MAX} x rate"
    if why := Iperf.missing():
        return row(check, expected, "-", "skip", f"skipped: {why}")
    r = Rate.parse(rate)
    _set(tb, rate=r)
    ratios: list[float] = []
    best = 0.0
    while len(ratios) < GOODPUT_TRIES and (not ratios or max(ratios) < GOODPUT_MIN):
        res = iperf.run(["-O", "1"], GOODPUT_SECONDS)
        bps = res["end"]["sum_received"]["bits_per_second"]
        ratios.append(bps / r.bps)
        best = max(best, bps)
    ratio = max(ratios)
    detail = "" if len(ratios) == 1 else f"best of {len(ratios)} tries: {', '.join(f'{x:.3f}' for x in ratios)}"
    return row(check, expected, f"{mbit(best)} ({ratio:.3f})", goodput_verdict(ratio), detail,
               rate_bps=r.bps, goodput_bps=best, ratio=ratio, ratios=ratios)


def change_row(tb, iperf: Iperf) -> dict:
    """A flow runs at CHANGE[0]; after three whole seconds the link is set to CHANGE[1]; the
    median goodput per second (the server's reports) before the change and after it settled.
    Measured once more if it fails (a busy CPU only lowers goodput)."""
    old, new = (Rate.parse(x) for x in CHANGE)
    check, expected = f"live rate change {old} -> {new}", f"both {GOODPUT_MIN}-{GOODPUT_MAX} x rate"
    if why := Iperf.missing():
        return row(check, expected, "-", "skip", f"skipped: {why}")
    for tries in range(1, GOODPUT_TRIES + 1):  # noqa: B007  (read after the loop)
        at, b, a = _change_once(tb, iperf, old, new)
        rb, ra = b / old.bps, a / new.bps
        verdict = "pass" if goodput_verdict(rb) == goodput_verdict(ra) == "pass" else "fail"
        if verdict == "pass":
            break
    return row(check, expected, f"{mbit(b)} -> {mbit(a)} ({rb:.3f}, {ra:.3f})", verdict,
               f"set {at:.1f} s into the flow" + (f" (try {tries})" if tries > 1 else ""), before_bps=b,
               after_bps=a, before_ratio=rb, after_ratio=ra, changed_at_s=at, tries=tries)


def _change_once(tb, iperf: Iperf, old: Rate, new: Rate) -> tuple[float, float, float]:
    """(when the rate changed, in seconds into the flow; median goodput before; after)."""
    _set(tb, rate=old)
    seconds = 8
    client, slog, clog = iperf.start([], seconds)
    deadline = time.monotonic() + seconds + 10
    while len(_intervals(slog)) < 4:  # the first (slow start) and three whole seconds at the old rate
        if client.poll() is not None or time.monotonic() > deadline:
            raise TestbedError(f"the flow for the rate change ended early: {Iperf._tail(slog)}")
        time.sleep(0.05)
    at = _intervals(slog)[-1]["offset_s"] + 1.0  # now, in the flow's own clock (reports are flushed)
    _set(tb, rate=new)
    iperf.result(client, clog, seconds)
    recs = _intervals(slog)
    before = [r["bits_per_second"] for r in recs if r["offset_s"] >= 1.0 and r["offset_s"] + r["interval_s"] <= at]
    after = [r["bits_per_second"] for r in recs if r["offset_s"] >= at + CHANGE_SETTLE_S and r["interval_s"] >= 0.9]
    if not before or not after:
        raise TestbedError(f"the rate change flow reported too few seconds ({len(before)} before, {len(after)} after)")
    return at, statistics.median(before), statistics.median(after)


def _intervals(log: Path) -> list[dict]:
    try:
        return parse_server_log(log.read_text(errors="replace"))
    except OSError:
        return []


def netem_rows(tb, iperf: Iperf, missing: str | None) -> list[dict]:
    """Delay and loss, each set alone on the shaped link and measured; put back to none after."""
    rows = [("netem delay", f"RTT {2 * Duration.parse(DELAY).us / 1000:g} ms (+{DELAY_SLACK_MS:g} ms)"),
            ("netem loss", f"{LOSS_RANGE[0]:g}-{LOSS_RANGE[1]:g} % lost")]
    if missing:
        return [row(f"{c} {DELAY if 'delay' in c else LOSS}", e, "-", "skip", "skipped: no netem in this kernel",
                    why=missing) for c, e in rows]
    _set(tb, rate=Rate.parse("100mbit"))
    try:
        return [_delay_row(tb, rows[0][1]), _loss_row(tb, iperf, rows[1][1])]
    finally:
        with contextlib.suppress(TestbedError):  # the testbed went away: nothing to put back
            _set(tb, delay=Duration(0), loss=Loss(0.0))


RTT_PROBE = """
import socket, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(n):
    s = socket.socket()
    s.settimeout(5)
    t = time.perf_counter()
    try:
        s.connect((addr, port))
    except ConnectionRefusedError:
        print(time.perf_counter() - t)
    finally:
        s.close()
"""
"""Round trips from inside a node: a TCP connect to a closed port is answered by a RST, one
round trip later (no listener, no delayed ACK to blur it)."""


def rtt_ms(tb, n: int = 20) -> float:
    """The median round trip CLIENT -> SERVER in ms."""
    r = tb.exec(CLIENT, [sys.executable, "-c", RTT_PROBE, tb.address(SERVER), "9", str(n)],
                capture_output=True, text=True, timeout=60)
    samples = [float(x) * 1000 for x in r.stdout.split()]
    if r.returncode != 0 or len(samples) < n // 2:
        raise TestbedError(f"the round-trip probe failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return statistics.median(samples)


def _delay_row(tb, expected: str) -> dict:
    d = Duration.parse(DELAY)
    base = rtt_ms(tb)
    _set(tb, delay=d)
    got = rtt_ms(tb)
    want = 2 * d.us / 1000
    return row(f"netem delay {DELAY}", expected, f"RTT {got:.2f} ms", within(got, DELAY_LOW * want,
                                                                           want + DELAY_SLACK_MS),
               f"{base:.2f} ms without delay", rtt_ms=got, base_rtt_ms=base, expected_rtt_ms=want)


def _loss_row(tb, iperf: Iperf, expected: str) -> dict:
    check = f"netem loss {LOSS}"
    if why := Iperf.missing():
        return row(check, expected, "-", "skip", f"skipped: {why}")
    _set(tb, delay=Duration(0), loss=Loss.parse(LOSS))
    res = iperf.run(["-u", "-b", "10M", "-l", "1200"], 3)
    end = res["end"].get("sum_received") or res["end"]["sum"]
    lost = float(end["lost_percent"])
    return row(check, expected, f"{lost:.2f} % lost", within(lost, *LOSS_RANGE),
               f"{end.get('lost_packets')} of {end.get('packets')} UDP datagrams", lost_percent=lost)
