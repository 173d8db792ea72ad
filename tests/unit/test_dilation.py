"""Time dilation's arithmetic (issue 45): rates, delays, traces and compute times scale by K,
recorded times divide by K, refusals are one line, and --dilation auto's ladder."""

from __future__ import annotations

import json

import pytest

from testbed.common.errors import TestbedError
from testbed.model.links import Link
from testbed.model.shapes import Shape
from testbed.model.trace import load_trace, parse_csv
from testbed.model.units import Duration, Loss, Rate
from testbed.runs import dilation
from testbed.runs.dilation import Auto
from testbed.runs.dilation_auto import agree, run_auto
from testbed.runs.request import RunRequest, UserCode
from testbed.runs.spec import WorkloadSpec
from testbed.runs.summary import _bottleneck
from testbed.runs.reports.timeline import RateTimeline

SYNTHETIC = ["--compute-time", "0.2", "--max-iters", "5"]


@pytest.mark.parametrize("text, k", [("4", 4.0), ("1", 1.0), ("2.5", 2.5), ("auto", Auto(1, 64)), (" AUTO ", Auto()),
                                     ("auto:8-256", Auto(8, 256)), ("auto:1-2", Auto(1, 2))])
def test_dilation_values(text, k):
    assert dilation.parse(text) == k


@pytest.mark.parametrize("text", ["0.5", "0", "-2", "nan", "inf", "1001", "x", "", "auto:", "auto:8", "auto:8-12",
                                  "auto:0-8", "auto:8-2000", "auto:a-b", "auto:1-2-4"])
def test_bad_dilation_values_are_one_line(text):
    with pytest.raises(TestbedError) as e:
        dilation.parse(text)
    assert f"--dilation {text}" in e.value.message and "\n" not in e.value.message


def test_a_shape_is_slowed_k_fold_and_loss_and_queue_are_kept():
    s = Shape(rate=Rate.parse("1gbit"), delay=Duration.parse("5ms"), jitter=Duration.parse("1ms"),
              loss=Loss.parse("0.5%"), limit=300)
    d = dilation.dilated(s, 8)
    assert d.rate == Rate.parse("125mbit")
    assert d.delay == Duration.parse("40ms") and d.jitter == Duration.parse("8ms")
    assert d.loss == s.loss and d.limit == 300
    link = Link(0, "a", "b", d, d)
    assert dilation.emulated(link, 8).forward == s  # the summary's view is the topology's


def test_a_shape_too_slow_or_too_late_after_dilation_is_refused():
    with pytest.raises(TestbedError, match="below the lowest rate"):
        dilation.dilated(Shape(rate=Rate.parse("100kbit")), 20)
    with pytest.raises(TestbedError, match="exceeds 60 s"):
        dilation.dilated(Shape(rate=Rate.parse("1gbit"), delay=Duration.parse("1s")), 100)


def test_a_trace_is_slowed_k_fold(tmp_path):
    trace = parse_csv(["0,1gbit", "2,100mbit,10ms", "5,500mbit"])
    out = dilation.dilate_trace(trace, 4, tmp_path / "t.csv")
    back = load_trace(out, "csv")
    assert [(s.at_s, s.rate) for s in back.steps] == [(0.0, Rate.parse("250mbit")), (8.0, Rate.parse("25mbit")),
                                                      (20.0, Rate.parse("125mbit"))]
    assert back.steps[1].delay == Duration.parse("40ms") and back.period_s is None


def test_a_looping_trace_keeps_its_period(tmp_path):
    trace = parse_csv(["0,1gbit", "30,100mbit", "60,1gbit"], loop=True)
    back = load_trace(dilation.dilate_trace(trace, 2, tmp_path / "t.csv"), "csv", loop=True)
    assert back.period_s == 120.0 and [s.at_s for s in back.steps] == [0.0, 60.0]


def _req(argv=SYNTHETIC, **kw) -> RunRequest:
    return RunRequest(scheme="allreduce", spec=WorkloadSpec.parse("allreduce", argv), **kw)


def test_dilation_is_refused_where_it_would_be_wrong(tmp_path):
    dilation.check(_req(dilation=4))  # the built-in trainer with --compute-time: fine
    dilation.check(_req(["--max-iters", "3"]))  # K = 1: nothing to check
    cases = [
        (_req(["--max-iters", "3"], dilation=4), "needs --compute-time"),
        (RunRequest(scheme="script:x.py", code=UserCode.script(tmp_path / "x.py"), dilation=4), "compute is real"),
        (_req(dilation=4, cross_traffic=["a flow"]), "TCP's own timers"),
    ]
    for req, says in cases:
        with pytest.raises(TestbedError, match=says) as e:
            dilation.check(req)
        assert "\n" not in e.value.message
    with pytest.raises(TestbedError, match="traffic:"):
        dilation.check_flows(["a flow"], 2)
    dilation.check_flows(["a flow"], 1)


def test_the_workload_takes_dilation_only_with_a_stated_compute_time():
    spec = WorkloadSpec.parse("allreduce", [*SYNTHETIC, "--dilation", "4"])
    assert spec.options.dilation == 4.0 and "--dilation" in spec.argv()
    assert WorkloadSpec.parse("allreduce", spec.args()).options == spec.options
    with pytest.raises(TestbedError, match="--dilation needs --compute-time"):
        WorkloadSpec.parse("allreduce", ["--max-iters", "3", "--dilation", "4"])
    with pytest.raises(TestbedError, match=r"--dilation is a factor in \[1, 1000\]"):
        WorkloadSpec.parse("allreduce", [*SYNTHETIC, "--dilation", "0.5"])


def test_the_summary_gives_emulated_rates_and_seconds():
    """A link 4 times slower for 4 times as long carried the same bytes: the summary's rate
    and seconds are the emulated ones and the utilisation is that of the emulated link."""
    slow = Shape(rate=Rate.parse("25mbit"))
    link = Link(0, "s1", "s0", slow, slow, bottleneck=True, name="s1-s0")
    start = {(0, "forward"): {"bytes": 0}, (0, "reverse"): {"bytes": 0}}
    end = {(0, "forward"): {"bytes": 50_000_000}, (0, "reverse"): {"bytes": 0}}
    dilated = _bottleneck([link], start, 40.0 / 4, end, 10, 4)
    plain = _bottleneck([Link(0, "s1", "s0", Shape(rate=Rate.parse("100mbit")), slow, name="s1-s0")],
                        start, 10.0, end, 10)
    assert dilated["links"]["s1-s0 forward"]["rate_bps"] == 100e6
    assert dilated["links"]["s1-s0 forward"]["utilisation"] == pytest.approx(
        plain["links"]["s1-s0 forward"]["utilisation"]) == pytest.approx(0.4)


def test_a_dilated_trace_timeline_reads_emulated_rates(tmp_path):
    (tmp_path / "trace.jsonl").write_text(json.dumps({"event": "step", "time": 100.0, "rate": "25mbit"}) + "\n")
    shapes = {"s1-s0": {"forward": {"rate": "1gbit"}, "reverse": {"rate": "1gbit"}}}
    rates, _ = RateTimeline.from_run(tmp_path, shapes, dilation=4)
    assert rates.at(101.0) == 100e6 and rates.k == 4
    # an iteration of 1 emulated second that ended at t=101 ran 4 wall-clock seconds
    (tmp_path / "rank0.jsonl").write_text(json.dumps({"time": 101.0, "iter_s": 1.0}) + "\n")
    from testbed.runs.reports.timeline import annotate_rates

    annotate_rates(tmp_path, 1, rates)
    rec = json.loads((tmp_path / "rank0.jsonl").read_text())
    assert rec["link_rate_bps"] == pytest.approx((1e9 * 3 + 100e6 * 1) / 4)


def test_auto_doubles_k_until_two_agree(tmp_path):
    medians = {1.0: 1.00, 2.0: 0.80, 4.0: 0.70, 8.0: 0.69, 16.0: 0.69}
    seen = []

    def run_one(req):
        seen.append(req.dilation)
        d = tmp_path / req.run_id
        d.mkdir()
        return {"run_id": req.run_id, "run_dir": str(d), "median_iter_s": medians[req.dilation]}

    s = run_auto(_req(run_id="r", out=tmp_path), run_one, lambda m: None)
    assert seen == [1.0, 2.0, 4.0, 8.0]
    assert s["dilation_validated"] is True and s["run_id"] == "r-k8"
    assert [c["k"] for c in s["dilation_curve"]] == seen
    assert json.loads((tmp_path / "r-k8" / "summary.json").read_text())["dilation_validated"] is True


def test_auto_that_never_agrees_is_not_validated(tmp_path):
    def run_one(req):
        d = tmp_path / req.run_id
        d.mkdir()
        return {"run_id": req.run_id, "run_dir": str(d), "median_iter_s": 1.0 / req.dilation}

    s = run_auto(_req(run_id="r", out=tmp_path), run_one, lambda m: None, Auto(1, 8))
    assert s["dilation_validated"] is False and [c["k"] for c in s["dilation_curve"]] == [1, 2, 4, 8]


def test_agreement_and_ladder():
    assert agree(1.0, 1.049) and agree(1.0, 0.951) and not agree(1.0, 1.06) and not agree(0.0, 0.0)
    assert Auto().ladder() == [1, 2, 4, 8, 16, 32, 64] and Auto(1, 1).ladder() == [1]
    assert Auto(8, 256).ladder() == [8, 16, 32, 64, 128, 256] and Auto(3, 20).ladder() == [3, 6, 12]


def test_auto_from_a_first_k(tmp_path):
    seen = []

    def run_one(req):
        seen.append(req.dilation)
        d = tmp_path / req.run_id
        d.mkdir()
        return {"run_id": req.run_id, "run_dir": str(d), "median_iter_s": 0.1 + 1.0 / req.dilation}

    s = run_auto(_req(run_id="r", out=tmp_path), run_one, lambda m: None, Auto(8, 256))
    # 225, 162.5, 131.3, 115.6, 107.8, 103.9 ms: 128 and 256 are the first within 5 %
    assert seen == [8, 16, 32, 64, 128, 256]
    assert s["dilation_validated"] is True and s["run_id"] == "r-k256"


def test_the_ranks_divide_what_they_record(monkeypatch):
    """workloads.loop divides each iteration's seconds (and DDP's timers) by K."""
    import argparse

    from workloads.loop import Loop, Progress

    class Timers:
        def read(self):
            return 0.8, 0.4, 0.2

    class State:
        def take_payload_bytes(self):
            return 10

    written = []

    class Log:
        def write(self, rec):
            written.append(rec)

    args = argparse.Namespace(dilation=4.0, log_every=0)
    loop = Loop(args, None, 0, 1, None, None, None, State(), None, None, Timers(), object(), 3, 3, None, Log())
    monkeypatch.setattr(loop, "step", lambda x, y: (2.0, 0.0))
    monkeypatch.setattr(loop, "_batches", lambda epoch, aug: iter([(None, None)] * 3))
    monkeypatch.setattr(loop, "args", argparse.Namespace(dilation=4.0, log_every=0, seed=0, eval_every=0))
    monkeypatch.setattr("workloads.compat.rebuild_buckets_now", lambda ddp: None)
    progress = loop.run()
    assert isinstance(progress, Progress) and progress.iter_s == [0.5, 0.5, 0.5] and progress.train_s == 1.5
    assert written[0]["iter_s"] == 0.5 and (written[0]["compute_s"], written[0]["comm_s"]) == (0.2, 0.1)


def _cli(*args):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ))


@pytest.mark.parametrize("argv, says", [
    (["run", "allreduce", "--dilation", "4", "--max-iters", "3"], "--dilation 4 needs --compute-time"),
    (["run", "allreduce", "--dilation", "0.5", *SYNTHETIC], "--dilation 0.5: give a factor K in [1, 1000]"),
    (["run", "allreduce", "--dilation", "auto", "--max-iters", "3"], "--dilation auto needs --compute-time"),
    (["run", "allreduce", "--dilation", "2", *SYNTHETIC, "--cross-traffic", "w0->w7"], "TCP's own timers"),
    (["run", "allreduce", "--dilation", "2000", *SYNTHETIC], "[1, 1000]"),
    (["sweep", "--schemes", "allreduce", "--dilation", "auto", *SYNTHETIC], "not 'auto'"),
    (["sweep", "--schemes", "allreduce", "--dilation", "2", "--max-iters", "3"], "needs --compute-time"),
])
def test_refusals_from_the_command_line_are_one_line_and_leave_no_out(tmp_path, argv, says):
    r = _cli(*argv, "--out", str(tmp_path / "runs"))
    assert r.returncode == 1 and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len([x for x in r.stderr.splitlines() if x.startswith("error")]) == 1
    assert not (tmp_path / "runs").exists()


def test_every_run_of_a_dilated_sweep_is_dilated(tmp_path):
    from testbed.runs.sweeps.sweep import SweepRequest, _request

    req = SweepRequest(schemes=["allreduce", "topk:0.01"], bws=[], workload_args=SYNTHETIC, dilation=8)
    req.check()
    runs = [_request(req, s, {}, 0, None, "tb", None, tmp_path, f"r{s}") for s in req.schemes]
    assert [r.dilation for r in runs] == [8, 8]
    with pytest.raises(TestbedError, match="needs --compute-time"):
        SweepRequest(schemes=["allreduce"], bws=[], workload_args=["--max-iters", "3"], dilation=8).check()


def test_a_synthetic_run_of_many_ranks_is_not_bounded_by_the_data_set():
    """--compute-time reads no data: 64 ranks x batch 32 exceed digits' 1438 training
    samples, which ended such runs ("exceeds the training samples") before they started."""
    import argparse

    from workloads.train import _iterations

    args = argparse.Namespace(max_iters=5, epochs=15, batch_size=32)
    assert _iterations(args, None, 64, synthetic=object()) == (5, 5)


def test_the_memory_of_many_ranks_is_their_proportional_set_sizes():
    """Summed resident sizes count torch's shared libraries once per rank (64 ranks: 22 GB
    "used" on a 23 GB machine that had 11 GB free); the proportional set size shares them."""
    from workloads.measure import max_rss_bytes, pss_bytes

    pss = pss_bytes()
    assert pss is not None and 0 < pss <= max_rss_bytes()
