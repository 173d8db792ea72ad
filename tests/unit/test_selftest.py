"""`testbed selftest`'s verdicts and output, without a kernel (the real runs: tests/kernel/test_selftest.py)."""

import json
import signal

import pytest

from testbed.cli import main
from testbed.common import rootless
from testbed.common.errors import TestbedError
from testbed.runs import selftest, selftest_net
from testbed.runs.selftest_net import GOODPUT_MAX, GOODPUT_MIN, goodput_verdict, row, within


@pytest.mark.parametrize("ratio, verdict", [(0.956, "pass"), (GOODPUT_MIN, "pass"), (0.849, "fail"), (0.5, "fail"),
                                            (GOODPUT_MAX, "pass"), (1.051, "fail"), (2.0, "fail")])
def test_goodput_verdict_thresholds(ratio, verdict):
    assert goodput_verdict(ratio) == verdict


def test_thresholds_admit_tcp_over_an_exact_shaper():
    """TCP over HTB gives 0.956 of the rate (headers at MTU 1500): well inside the pass range."""
    assert GOODPUT_MIN < 0.956 < 1.0 < GOODPUT_MAX
    assert within(21.0, 0.95 * 20, 20 + selftest_net.DELAY_SLACK_MS) == "pass"
    assert within(25.0, 0.95 * 20, 20 + selftest_net.DELAY_SLACK_MS) == "fail"
    assert within(2.0, *selftest_net.LOSS_RANGE) == "pass" and within(0.0, *selftest_net.LOSS_RANGE) == "fail"


def test_a_row_has_the_five_fields_and_its_numbers():
    r = row("c", "e", "m", "skip", "d", x=1)
    assert r == {"check": "c", "expected": "e", "measured": "m", "verdict": "skip", "detail": "d", "data": {"x": 1}}
    with pytest.raises(AssertionError):
        row("c", "e", "m", "ok")


def test_a_run_passes_only_when_ok_and_proven():
    links = {"s0-s1 forward": {"bound_bytes": 1000, "measured_bytes": 1050},
             "s0-s1 reverse": {"bound_bytes": 0, "measured_bytes": 7}, "w0-s0 forward": "damaged"}
    ok = selftest._run_result("run", {"status": "ok", "proof": "passed", "iterations": 4, "proof_links": links},
                              None, 5.0)
    assert ok["verdict"] == "pass" and ok["measured"] == "status ok, proof passed"
    assert "measured/bound: s0-s1 forward 1.05x" in ok["detail"] and "reverse" not in ok["detail"]
    bypassed = selftest._run_result("run", {"status": "bypassed", "proof": "bypassed"}, "did not cross", 5.0)
    assert bypassed["verdict"] == "fail" and bypassed["detail"] == "did not cross"
    assert selftest.failure_line(bypassed) == ("run: measured status bypassed, proof bypassed, expected status ok, "
                                               "proof passed; did not cross")
    no_summary = selftest._run_result("run", {}, "a rank failed", 1.0)
    assert no_summary["verdict"] == "fail" and no_summary["measured"] == "status failed, proof -"
    older = selftest._run_result("run", {"status": "ok", "proof": "passed", "iterations": 4}, None, 5.0)
    assert older["verdict"] == "pass" and "measured/bound" not in older["detail"]  # no proof_links: nothing shown


def test_gpu_without_gpus_is_refused_with_how_to_check(monkeypatch):
    monkeypatch.setattr(selftest, "gpu_names", list)
    with pytest.raises(TestbedError, match=r"no NVIDIA GPU found.*nvidia-smi -L"):
        selftest.check_gpu(True)
    assert selftest.check_gpu(False) == []
    monkeypatch.setattr(selftest, "gpu_names", lambda: ["GPU 0: NVIDIA H100"])
    assert selftest.check_gpu(True) == ["GPU 0: NVIDIA H100"]


def _fake(rows):
    failed = [selftest.failure_line(r) for r in rows if r["verdict"] == "fail"]
    return {"ok": not failed, "machine": {"kernel": "6.1", "cpus": 2, "rootless": False, "netem_missing": "no",
                                          "iperf3": "/usr/bin/iperf3", "gpus": []},
            "rows": rows, "failed": failed, "seconds": 30.0}


def _main(monkeypatch, capsys, rows, *args):
    monkeypatch.setattr(rootless, "needed", lambda: False)
    monkeypatch.setattr(selftest, "selftest", lambda gpu, say: _fake(rows))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as e:
            main(["selftest", *args])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return e.value.code, capsys.readouterr()


GOOD = row("TCP goodput at 50mbit", "0.85-1.05 x rate", "47.8 Mbit/s (0.956)", "pass")
SKIP = row("netem delay 10ms", "RTT 20 ms", "-", "skip", "skipped: no netem in this kernel")
BAD = row("TCP goodput at 1gbit", "0.85-1.05 x rate", "501.0 Mbit/s (0.501)", "fail")


def test_cli_exits_0_with_skips_and_1_with_one_line_per_failed_row(monkeypatch, capsys):
    code, got = _main(monkeypatch, capsys, [GOOD, SKIP])
    assert code == 0 and "faithful: 1 passed, 0 failed, 1 skipped in 30 s" in got.out and got.err == ""
    assert "skipped: no netem in this kernel" in got.out
    code, got = _main(monkeypatch, capsys, [GOOD, SKIP, BAD, {**BAD, "check": "TCP goodput at 200mbit"}])
    assert code == 1 and "NOT faithful: 1 passed, 2 failed, 1 skipped" in got.out
    assert got.err.splitlines() == [
        "selftest failed: TCP goodput at 1gbit: measured 501.0 Mbit/s (0.501), expected 0.85-1.05 x rate",
        "selftest failed: TCP goodput at 200mbit: measured 501.0 Mbit/s (0.501), expected 0.85-1.05 x rate"]


def test_cli_json_is_one_object_with_the_rows(monkeypatch, capsys):
    code, got = _main(monkeypatch, capsys, [GOOD, BAD], "--json")
    res = json.loads(got.out)
    assert code == 1 and res["ok"] is False and [r["verdict"] for r in res["rows"]] == ["pass", "fail"]
    assert res["failed"] == ["TCP goodput at 1gbit: measured 501.0 Mbit/s (0.501), expected 0.85-1.05 x rate"]


def test_gpu_rows_run_every_scheme_under_nccl_within_the_budget(monkeypatch, tmp_path):
    from workloads.schemes import names

    calls = []

    def fake_run(out, scheme, args, bw, timeout, say, check):
        calls.append((scheme, args, str(bw), timeout))
        return row(check, "status ok, proof passed", "status ok, proof passed", "pass")

    monkeypatch.setattr(selftest, "run_row", fake_run)
    rows = selftest.gpu_rows(tmp_path, 1, lambda m: None)
    assert [r["check"] for r in rows] == [f"nccl {s} on 1 GPU" for s in names()]
    assert {r["check"]: r["verdict"] for r in rows}["nccl hook on 1 GPU"] == "skip"
    assert [c[0] for c in calls] == [s for s in names() if s != "hook"]
    assert all("--backend" in a and a[a.index("--backend") + 1] == "nccl" for _, a, _, _ in calls)
    assert all(0 < t <= selftest.RUN_TIMEOUT_S for *_, t in calls)
    monkeypatch.setattr(selftest, "GPU_BUDGET_S", 0.0)  # spent: what is left is not started, and fails
    late = selftest.gpu_rows(tmp_path, 2, lambda m: None)
    assert {r["verdict"] for r in late if "hook" not in r["check"]} == {"fail"}
    assert "budget is spent" in late[0]["detail"] and late[0]["check"] == "nccl allreduce on 2 GPUs"
