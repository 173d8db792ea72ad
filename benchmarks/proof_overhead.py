"""What the proof's counting of collectives costs a training iteration (goal: under 2 %).

Every rank testbed starts has torch's flight recorder on with a large ring
(``TORCH_FR_BUFFER_SIZE=131072``) and counts with ``workloads.collectives``
(``TESTBED_COLLECTIVES``: ``isend`` wrapped, the recorder folded at evaluations, a file
written at the end). Both are measured here without a testbed, gloo on loopback, with
counting on and counting off (``TORCH_FR_BUFFER_SIZE=0``, no ``TESTBED_COLLECTIVES``),
compared within one invocation because the machine is noisy:

* Training: ``--ranks`` processes of ``python -m workloads.train`` (the CNN on digits,
  ``--max-iters`` iterations, one evaluation at the end), ``--pairs`` on/off pairs of runs
  per scheme, one run at a time, the order alternating (on-off, off-on, ...); with
  ``--together`` a pair's two runs at the same time (twice the processes on the same
  cores: other load on the machine then slows both alike). A run's figure is rank 0's
  median ``iter_s`` without the first ``--skip`` iterations (DDP's first iteration and its
  bucket rebuild); a pair's, on / off. Printed per scheme: the median ratio and its
  min-max over the pairs, and the collectives (recorded) and isends (wrapped) an
  iteration makes, from the on-runs' files.
* Per call: three pairs of processes at once, counting on, off, and torch's own default
  (no ``TORCH_FR_BUFFER_SIZE``: torch 2.13 records 2000 entries unasked), taking turns
  through a store so that their blocks interleave in time (order rotating round by
  round): ``--micro-calls`` back-to-back all_reduces of one float, then as many isend/irecv
  ping-pong messages, per turn; a turn's figure is its fastest of 5 blocks, wall clock
  and the calling thread's CPU time. Printed: on - off within each round, the median and
  min-max over ``--micro-rounds`` rounds.

One collective's cost is far below the training runs' noise (ranks sharing cores), so
"expected" is the micro-benchmark's added calling-thread CPU times the calls an iteration
makes, over the iteration's time.

    python -m benchmarks.proof_overhead [--schemes allreduce,spardl] [--ranks 4] [--pairs 4]
                                        [--together] [--max-iters 40] [--skip 2] [--micro-calls 500]
                                        [--micro-rounds 12] [--train-args "..."] [--json] [--keep DIR]
                                        [--record DIR]

``--record DIR`` writes every training run's and every per-call round's figures to
DIR/result.json, which ``python -m benchmarks.archive DIR --name NAME`` archives and
``benchmarks.proof_tables`` makes docs/results/proof.md's tables of (the tables printed here).

2.5 to 8 minutes at its defaults on a 2-core machine, as loaded as the machine is; no root, no testbed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDER = "131072"  # as testbed sets it (workloads.collectives.RECORDER_ENTRIES)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, on: bool, files: Path | None) -> dict:
    """torchrun's environment on loopback (as tests/workloads/launch.py), counting on or off."""
    e = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
             LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
             OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for k in ("TESTBED_COLLECTIVES", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        e.pop(k, None)
    e["TORCH_FR_BUFFER_SIZE"] = RECORDER if on else "0"
    if on and files is not None:
        e["TESTBED_COLLECTIVES"] = str(files / f"collectives{rank}.json")
    return e


def start(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    """``python argv`` in the repository, its output to ``log``."""
    with open(log, "w") as f:  # the child holds its own copy
        return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)


def launch(groups: list[tuple[int, list[str], bool, Path]], timeout: float) -> None:
    """Groups of processes at once, each ``(world, python argv, counting on?, its folder)``
    (its ranks' output in the folder); returns when all have ended. Raises when one fails."""
    procs = []
    for world, argv, on, where in groups:
        port = free_port()
        procs += [(argv, r, where / f"rank{r}.log", start(argv, rank_env(r, world, port, on, where),
                                                         where / f"rank{r}.log")) for r in range(world)]
    deadline = time.monotonic() + timeout
    try:
        for *_, p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        reap([(" ".join(argv), r, log, p) for argv, r, log, p in procs])


def reap(procs: list[tuple[str, int, Path, subprocess.Popen]]) -> None:
    """Kill those of ``procs`` (what, rank, log, process) still running; then raise naming the
    first that failed (one that exited by itself before one that was killed), with its log's end."""
    for *_, p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for what, r, log, p in sorted(procs, key=lambda x: x[3].returncode < 0):
        if p.returncode != 0:
            raise SystemExit(f"{what}, rank {r} exited {p.returncode}:\n{log.read_text()[-3000:]}")


# -- training ----------------------------------------------------------------------------

def train_runs(scheme: str, settings: list[bool], a, tmp: Path, n: int) -> list[dict]:
    """One training run per setting (counting on?), all at once: their figures."""
    groups = []
    for on in settings:
        where = tmp / f"{scheme.replace(':', '_')}-{n}-{'on' if on else 'off'}"
        where.mkdir()
        groups.append((a.ranks, ["-m", "workloads.train", "--scheme", scheme, "--dataset", "digits",
                                 "--epochs", "1000", "--max-iters", str(a.max_iters), "--eval-every",
                                 str(a.max_iters), "--log-every", "0", "--out", str(where / "run"),
                                 *shlex.split(a.train_args)], on, where))
    t0 = time.perf_counter()
    launch(groups, timeout=600)
    wall = time.perf_counter() - t0
    return [train_figures(scheme, on, where, a.skip, wall) for _, _, on, where in groups]


def train_figures(scheme: str, on: bool, where: Path, skip: int, wall: float) -> dict:
    recs = [json.loads(line) for line in (where / "run" / "rank0.jsonl").read_text().splitlines() if line.strip()]
    steady = [r["iter_s"] for r in recs if r["iter"] > skip]
    if not steady:
        raise SystemExit(f"{scheme}: no iteration after --skip {skip} (of {len(recs)})")
    row = {"scheme": scheme, "on": on, "iter_s": statistics.median(steady), "iterations": len(recs), "wall_s": wall}
    counts = where / "collectives0.json"
    if on:  # what rank 0 counted in its training iterations
        c = json.loads(counts.read_text())
        row["recorded_per_iter"] = sum(o["count"] for o in c["ops"] if o["phase"] == "train") / len(recs)
        row["isends_per_iter"] = sum(s["count"] for s in c["sends"] if s["phase"] == "train") / len(recs)
        row["entries"], row["uncounted"] = c["entries"], c["uncounted"]
    elif counts.exists():
        raise SystemExit(f"{scheme}: counting off, yet {counts} was written")
    return row


# -- per collective ----------------------------------------------------------------------

MICRO = ("on", "off", "default")
"""The micro-benchmark's settings: counting on, counting off, and torch's own default (no
TORCH_FR_BUFFER_SIZE: a recorder of 2000 entries, no TESTBED_COLLECTIVES)."""
OPS = ("all_reduce", "isend")
SUB = 5
"""Blocks per turn (the fastest counts)."""


def micro_order(rounds: int) -> list[str]:
    """The settings' turns: each round all three, the order rotating and reversing round by round."""
    turns = []
    for i in range(rounds):
        order = list(MICRO[i % 3:] + MICRO[:i % 3])
        turns += order[::-1] if i % 2 else order
    return turns


def micro_worker(calls: int, rounds: int) -> None:
    """One rank of one setting's pair of processes (started by micro_run). The settings take
    turns through a store the parent holds, so that their blocks interleave in time."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from workloads import collectives

    me = os.environ["PROOF_SETTING"]
    ledger = collectives.activate()  # as workloads.train: before the group
    dist.init_process_group("gloo")
    turns = dist.TCPStore("127.0.0.1", int(os.environ["PROOF_STORE_PORT"]), is_master=False,
                          timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    x = torch.ones(1)
    peer = 1 - rank

    def allreduce(n):
        for _ in range(n):
            dist.all_reduce(x)

    def pingpong(n):  # rank 0 sends, rank 1 answers: n messages
        for _ in range(n // 2):
            if rank == 0:
                dist.isend(x, peer).wait()
                dist.irecv(x, peer).wait()
            else:
                dist.irecv(x, peer).wait()
                dist.isend(x, peer).wait()

    turns.add("ready", 1)
    res = {op: [] for op in OPS} | {op + "_cpu": [] for op in OPS}
    step = 0
    for op, fn in (("all_reduce", allreduce), ("isend", pingpong)):
        n = calls // 2 * 2 if op == "isend" else calls
        for who in micro_order(rounds):
            if who == me:
                turns.wait([f"step{step}"])
                fn(max(n // 10, 2))  # warm-up: the other settings ran meanwhile
                wall, cpu = [], []
                for _ in range(SUB):
                    dist.barrier()
                    t0, c0 = time.perf_counter(), time.thread_time()
                    fn(n // SUB)
                    wall.append((time.perf_counter() - t0) / (n // SUB) * 1e6)
                    cpu.append((time.thread_time() - c0) / (n // SUB) * 1e6)  # the calling thread's
                res[op].append(min(wall))  # the least disturbed block of the turn
                res[op + "_cpu"].append(min(cpu))
                dist.barrier()
                if rank == 0:
                    turns.set(f"step{step + 1}", "1")
            step += 1
    try:  # what the recorder holds: proof that it was on (or off)
        from torch._C._distributed_c10d import _dump_fr_trace
        res["recorded"] = len(collectives.recorder_entries(_dump_fr_trace(True, False, False)) or [])
    except Exception:  # noqa: BLE001 (a private API; the count is only a check)
        res["recorded"] = None
    res["isends_counted"] = sum(c[0] for c in ledger.sends.values()) if ledger is not None else None
    collectives.finish()
    dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def micro_run(a, tmp: Path) -> dict:
    """Three pairs of processes at once, one per setting, taking turns: {setting: rank 0's result}."""
    from datetime import timedelta

    import torch.distributed as dist

    store_port = free_port()
    store = dist.TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=300))
    where = tmp / "micro"
    where.mkdir()
    procs = []
    argv = ["-m", "benchmarks.proof_overhead", "--micro-worker", "--micro-calls", str(a.micro_calls),
            "--micro-rounds", str(a.micro_rounds)]
    for setting in MICRO:
        port = free_port()
        for r in range(2):
            e = rank_env(r, 2, port, setting == "on", where / setting)
            if setting == "default":
                del e["TORCH_FR_BUFFER_SIZE"]
            e.update(PROOF_SETTING=setting, PROOF_STORE_PORT=str(store_port))
            (where / setting).mkdir(exist_ok=True)
            log = where / setting / f"rank{r}.log"
            procs.append((setting, r, log, start(argv, e, log)))
    try:
        deadline = time.monotonic() + 600
        while store.add("ready", 0) < len(procs):  # all started: then the turns begin
            if any(p.poll() is not None for *_, p in procs) or time.monotonic() > deadline:
                break  # one failed: the others are killed below, its log is shown
            time.sleep(0.1)
        else:
            store.set("step0", "1")
        for *_, p in procs:
            if store.add("ready", 0) < len(procs):
                break
            p.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        reap([(f"micro-benchmark, {setting}", r, log, p) for setting, r, log, p in procs])
    return {setting: json.loads(next(x for x in log.read_text().splitlines() if x.startswith("RESULT "))[7:])
            for setting, r, log, _ in procs if r == 0}


# -- report ------------------------------------------------------------------------------

def call_rows(micro: dict, rounds: int) -> list[dict]:
    """The per-call benchmark's figures as records: one row per op, clock and round, each
    setting's figure in µs (the settings took their turns of a round back to back)."""
    return [{"kind": "call", "op": op, "clock": clock, "round": i,
             **{s: micro[s][op if clock == "wall" else op + "_cpu"][i] for s in MICRO}}
            for op in OPS for clock in ("wall", "thread") for i in range(rounds)]


def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schemes", default="allreduce,spardl", help="comma-separated train --scheme values "
                   "(allreduce's all_reduce goes through the recorder, spardl's isends through the wrapper)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--pairs", type=int, default=4, help="on/off pairs of training runs per scheme (0: none)")
    p.add_argument("--together", action="store_true",
                   help="run a pair's on and off at the same time (2 x --ranks processes), so that other load "
                        "on the machine slows both alike")
    p.add_argument("--max-iters", type=int, default=40)
    p.add_argument("--skip", type=int, default=2, help="first iterations left out of each run's median")
    p.add_argument("--train-args", default="", help="more arguments for workloads.train (one string)")
    p.add_argument("--micro-calls", type=int, default=500, help="calls per setting's turn")
    p.add_argument("--micro-rounds", type=int, default=12, help="turns of each setting (0: no micro-benchmark)")
    p.add_argument("--json", action="store_true", help="print every run's figures as JSON too")
    p.add_argument("--keep", type=Path, default=None, help="a new folder to keep the runs' records and logs in")
    p.add_argument("--record", type=Path, metavar="DIR", default=None,
                   help="write every run's and every round's figures to DIR/result.json (for benchmarks.archive)")
    p.add_argument("--micro-worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.ranks < 2 or a.pairs < 0 or a.max_iters <= a.skip or a.micro_calls < 2 or a.micro_rounds < 0:
        raise SystemExit("need --ranks >= 2, --pairs >= 0, --max-iters > --skip, --micro-calls >= 2, "
                         "--micro-rounds >= 0")
    return a


def measure(a, schemes: list[str], tmp: Path) -> tuple[list[dict], dict]:
    """The per-call benchmark, then the training pairs: (training rows, per-call results)."""
    runs, micro = [], {}
    if a.micro_rounds:
        t0 = time.perf_counter()
        micro = micro_run(a, tmp)
        print(f"  micro-benchmark: {time.perf_counter() - t0:.0f} s", flush=True)
    for scheme in schemes if a.pairs else []:
        for n in range(a.pairs):
            order = [True, False] if n % 2 == 0 else [False, True]
            for rows in ([train_runs(scheme, order, a, tmp, n)] if a.together else
                         [train_runs(scheme, [on], a, tmp, n) for on in order]):
                for r in rows:
                    runs.append({"kind": "train", "pair": n, **r})
                    print(f"  {scheme} pair {n} {'on ' if r['on'] else 'off'}: median iter "
                          f"{r['iter_s'] * 1e3:.1f} ms ({r['wall_s']:.0f} s)", flush=True)
    return runs, micro


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.micro_worker:
        micro_worker(a.micro_calls, a.micro_rounds)
        return 0
    from benchmarks import proof_tables  # the tables, as the page shows them

    schemes = [s.strip() for s in a.schemes.split(",") if s.strip()]
    import torch
    started = time.perf_counter()
    print(f"torch {torch.__version__}, gloo on loopback, {os.cpu_count()} CPUs; counting on: "
          f"TORCH_FR_BUFFER_SIZE={RECORDER} + TESTBED_COLLECTIVES; off: TORCH_FR_BUFFER_SIZE=0", flush=True)
    with tempfile.TemporaryDirectory(prefix="proof-overhead-") as d:
        tmp = Path(d)
        if a.keep:
            tmp = a.keep
            tmp.mkdir(parents=True, exist_ok=False)
        runs, micro = measure(a, schemes, tmp)
    rows = runs + (call_rows(micro, a.micro_rounds) if micro else [])
    if micro:
        print(f"\nper call: 2 processes per setting, the 3 settings' pairs running at once and taking turns "
              f"(order rotating), {a.micro_rounds} turns each of {a.micro_calls} calls; 'added' is on - off "
              f"within a round; default: no TORCH_FR_BUFFER_SIZE (torch's own recorder, 2000 entries)\n")
        print(proof_tables.call_markdown(rows))
        print("Recorder entries at the end (rank 0): " + ", ".join(f"{s} {micro[s]['recorded']}" for s in MICRO)
              + f"; isends counted by the wrapper (on): {micro['on']['isends_counted']}")
    if a.pairs:
        print(f"\ntraining: {a.ranks} ranks, CNN on digits, {a.max_iters} iterations, rank 0's median iter_s "
              f"without the first {a.skip}; {a.pairs} on/off pairs per scheme, "
              + ("each pair's runs at the same time" if a.together else "one run at a time, order alternating")
              + "; on/off - 1 is the overhead (goal < 2 %); expected: the per-call added thread CPU x the calls "
              "per iteration / the off median\n")
        print(proof_tables.iteration_markdown(rows))
        print(f"uncounted entries: {sum(r.get('uncounted', 0) for r in runs)}")
    seconds = time.perf_counter() - started
    print(f"({seconds:.0f} s)")
    if a.record:
        extra = {k: getattr(a, k) for k in ("schemes", "ranks", "pairs", "together", "max_iters", "skip",
                                            "train_args", "micro_calls", "micro_rounds")}
        extra |= {"torch": torch.__version__, "seconds": round(seconds, 1)}
        if micro:
            extra |= {"recorded": {s: micro[s]["recorded"] for s in MICRO},
                      "isends_counted": micro["on"]["isends_counted"]}
        from benchmarks.archive import record
        print(f"recorded: {record(a.record, proof_tables.BENCHMARK, rows, **extra)}")
    if a.json:
        print(json.dumps({"micro": micro, "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
