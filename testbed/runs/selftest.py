"""`testbed selftest`: what this machine does, checked in about a minute.

    selftest(gpu, say) -> {"ok", "machine", "rows", "failed", "seconds"}

It brings up a dumbbell of its own (testbed ``selftest``: w0 - s0 == s1 - w1, the link
s0-s1 shaped), measures, and takes it down again in all cases (also on Ctrl-C or SIGTERM).
Each check is one row ``{check, expected, measured, verdict, detail, data}``; ``verdict`` is
pass, fail or skip. The machine gives faithful results when no row failed; a row skips when
this machine cannot run it at all (no netem in the kernel, no iperf3), saying why.

    TCP goodput at 50mbit, 200mbit, 1gbit    iperf3 w0 -> w1 against the rate (selftest_net)
    live rate change 500mbit -> 100mbit      Testbed.set_links while a flow runs
    netem delay, netem loss                  where the kernel has netem
    2-rank allreduce run                     the real run path: status ok, tc-counter proof passed
    with --gpu: every scheme under NCCL      on the GPUs nvidia-smi lists, within GPU_BUDGET_S
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from testbed.common import rootless
from testbed.common.errors import TestbedError
from testbed.common.files import read_json
from testbed.engine.core import Testbed, list_testbeds
from testbed.model.topology import load_topology_dict
from testbed.model.units import Rate
from testbed.nodes.gpus import gpu_names
from testbed.runs.interrupts import RunInterrupted, ignore_interrupts, install_signals
from testbed.runs.request import RunRequest
from testbed.runs.selftest_net import GOODPUT_RATES, Iperf, change_row, goodput_row, netem_rows, row

NAME = "selftest"
"""The self-test's testbed; one self-test at a time per user."""
RUN_BW = "200mbit"
RUN_ARGS = ["--max-iters", "4", "--eval-every", "4", "--backend", "gloo"]
"""The CPU run: DDP's own all-reduce of the default CNN on digits, 4 iterations."""
GPU_ARGS = ["--max-iters", "6", "--eval-every", "6", "--backend", "nccl"]
GPU_BUDGET_S = 480.0
"""Every scheme's NCCL run together must finish within 8 minutes; what is left is not started."""
RUN_TIMEOUT_S = 120.0
"""Seconds without progress from any rank before a run is stopped."""
GPU_SKIPPED = {"hook": "skipped: runs your own --hook module (none to test here)"}


def topology() -> dict:
    """Two workers, each behind its own switch; the switches joined by the one shaped link."""
    return {"name": NAME, "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch"},
                                    "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s1"]},
                      {"endpoints": ["s0", "s1"], "rate": "1gbit", "bottleneck": True}]}


def check_gpu(gpu: bool) -> list[str]:
    """The GPUs --gpu runs on (refused, before anything is built, where there are none)."""
    if not gpu:
        return []
    names = gpu_names()
    if not names:
        raise TestbedError("--gpu: no NVIDIA GPU found on this machine (`nvidia-smi -L` lists none; is the NVIDIA "
                           "driver installed?)")
    return names


def selftest(gpu: bool = False, say: Callable[[str], None] = lambda m: None) -> dict:
    """Bring up the self-test's testbed, run every check, take it down; the rows and the verdict."""
    gpus = check_gpu(gpu)
    if any(t["name"] == NAME for t in list_testbeds()):
        raise TestbedError(f"a testbed named '{NAME}' is already up: another `testbed selftest` runs, or one was "
                           "killed", f"wait for it to finish, or `testbed down {NAME}`")
    t0 = time.monotonic()
    machine = _machine(gpus)
    restore_signals = install_signals()  # SIGTERM and SIGHUP unwind like Ctrl-C
    workdir = Path(tempfile.mkdtemp(prefix="testbed-selftest-"))
    tb = iperf = None
    try:
        say(f"selftest: bringing up testbed {NAME} (2 workers, one shaped link)")
        tb = Testbed.up(load_topology_dict(topology()))
        iperf = Iperf(tb, workdir)
        rows = _rows(tb, iperf, workdir, machine, gpus, say)
    finally:
        ignore_interrupts()  # the cleanup runs to the end
        try:
            if iperf is not None:
                iperf.stop()
            if tb is not None:
                say(f"selftest: taking down {NAME}")
                tb.down()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            restore_signals()
    failed = [failure_line(r) for r in rows if r["verdict"] == "fail"]
    return {"ok": not failed, "machine": machine, "rows": rows, "failed": failed,
            "seconds": round(time.monotonic() - t0, 1)}


def failure_line(r: dict) -> str:
    """Why a failed row failed, in one line."""
    why = f"measured {r['measured']}, expected {r['expected']}" if r["measured"] != "-" else ""
    return f"{r['check']}: " + "; ".join(x for x in (why, r["detail"]) if x)


def _rows(tb, iperf: Iperf, workdir: Path, machine: dict, gpus: list[str], say) -> list[dict]:
    steps: list[tuple[str, Callable[[], list[dict] | dict]]] = [
        *[(f"TCP goodput at {r}", lambda r=r: goodput_row(tb, iperf, r)) for r in GOODPUT_RATES],
        ("live rate change", lambda: change_row(tb, iperf)),
        ("netem delay and loss", lambda: netem_rows(tb, iperf, machine["netem_missing"])),
        ("2-rank allreduce run", lambda: run_row(workdir / "runs", "allreduce", RUN_ARGS, Rate.parse(RUN_BW),
                                                 RUN_TIMEOUT_S, say)),
    ]
    rows: list[dict] = []
    for what, step in steps:
        say(f"selftest: {what}")
        rows += _guarded(what, step)
    if gpus:
        rows += gpu_rows(workdir / "gpu-runs", len(gpus), say)
    return rows


def _guarded(what: str, step) -> list[dict]:
    """A step's rows; a step that fails (iperf3 refused, a kernel call failed) is one failed row."""
    try:
        got = step()
    except TestbedError as e:
        return [row(what, "-", "-", "fail", e.message)]
    return got if isinstance(got, list) else [got]


def run_row(out: Path, scheme: str, args: list[str], bw: Rate, timeout: float, say, check: str | None = None) -> dict:
    """One run of ``scheme`` on the self-test's testbed through the real run path
    (testbed.runs.experiment.run); passes when its status is ok and its proof passed."""
    from testbed.runs.experiment import run

    check = check or f"2-rank {scheme} run ({bw})"
    run_id = f"selftest-{scheme}"
    req = RunRequest(scheme=scheme, workload_args=list(args), testbed=NAME, bw=bw, out=out, timeout=timeout,
                     run_id=run_id, exporter=False)
    t = time.monotonic()
    try:
        summary, error = run(req, on_message=say), None
    except RunInterrupted:
        raise KeyboardInterrupt from None  # its ranks are stopped: the self-test ends as interrupted
    except TestbedError as e:
        summary, error = _summary(out / run_id), e.message
    return _run_result(check, summary, error, time.monotonic() - t)


def _summary(run_dir: Path) -> dict:
    try:
        s = read_json(run_dir / "summary.json", "json", "summary")
    except (OSError, ValueError, TestbedError):
        return {}
    return s if isinstance(s, dict) else {}


def _run_result(check: str, s: dict, error: str | None, seconds: float) -> dict:
    status, proof = s.get("status", "failed"), s.get("proof", "-")
    ok = status == "ok" and proof == "passed" and error is None
    links = proof_links(s.get("proof_links"))
    done = f"{s.get('iterations')} iterations in {seconds:.0f} s"
    detail = "; ".join(x for x in (error or done, f"measured/bound: {links}" if links else "") if x)
    return row(check, "status ok, proof passed", f"status {status}, proof {proof}", "pass" if ok else "fail", detail,
               status=status, proof=proof, proof_links=s.get("proof_links"), seconds=round(seconds, 1))


def proof_links(links) -> str:
    """``LINK DIRECTION measured/bound`` for each link direction the proof bounds (the summary's
    ``proof_links``, where the run has it), e.g. ``s0-s1 forward 1.05x``."""
    if not isinstance(links, dict):
        return ""
    out = []
    for name, v in links.items():
        bound, got = (v.get("bound_bytes"), v.get("measured_bytes")) if isinstance(v, dict) else (None, None)
        if isinstance(bound, (int, float)) and bound > 0 and isinstance(got, (int, float)):
            out.append(f"{name} {got / bound:.2f}x")
    return ", ".join(out)


def gpu_rows(out: Path, n_gpus: int, say) -> list[dict]:
    """Every scheme under NCCL on the testbed (2 ranks sharing the GPUs found), each with its proof,
    all within GPU_BUDGET_S."""
    from workloads.schemes import names

    rows, t0 = [], time.monotonic()
    for scheme in names():
        check = f"nccl {scheme} on {n_gpus} GPU{'s' if n_gpus != 1 else ''}"
        if scheme in GPU_SKIPPED:
            rows.append(row(check, "status ok, proof passed", "-", "skip", GPU_SKIPPED[scheme]))
            continue
        left = GPU_BUDGET_S - (time.monotonic() - t0)
        if left < 30:
            rows.append(row(check, "status ok, proof passed", "-", "fail",
                            f"not started: the GPU runs' {GPU_BUDGET_S / 60:g}-minute budget is spent"))
            continue
        say(f"selftest: {check}")
        rows.append(run_row(out, scheme, GPU_ARGS, Rate.parse("1gbit"), min(RUN_TIMEOUT_S, left), say, check))
    return rows


def _machine(gpus: list[str]) -> dict:
    """What the rows were measured on."""
    from testbed.net.probe import netem_missing

    try:
        netem = netem_missing()
    except TestbedError as e:  # the probe could not make its namespace
        netem = e.message
    return {"kernel": platform.release(), "cpus": os.cpu_count(), "rootless": rootless.active(),
            "netem_missing": netem, "iperf3": shutil.which("iperf3"), "gpus": gpus}
