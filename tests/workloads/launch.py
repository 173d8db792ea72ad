"""Start N ``python -m workloads.train`` processes with torchrun's environment (for tests).

Two or more ranks are forked from a zygote (:mod:`testbed.nodes.zygote.launcher`), as `testbed run`
starts the ranks of netns workers: torch, dynamo and the workload imported once, not once
per rank (about 2 s of CPU each). ``TESTBED_ZYGOTE=0`` starts each as a plain process."""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed.common.procs import python_argv
from testbed.nodes.zygote import launcher as zygotes
from testbed.nodes.nsexec import DIE_WITH_PARENT
from workloads.records import read_jsonl

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Result:
    out: Path
    returncodes: list[int]
    logs: list[str]

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes)

    def summary(self) -> dict:
        import json
        return json.loads((self.out / "summary.json").read_text())

    def iters(self, rank: int = 0) -> list[dict]:
        return read_jsonl(self.out / f"rank{rank}.jsonl")

    def evals(self) -> list[dict]:
        return read_jsonl(self.out / "eval.jsonl")


def train(world: int, out: Path, *args: str, module: str = "workloads.train", timeout: float = 300,
          env: dict | None = None, domains: list[int] | None = None) -> Result:
    """``domains``: sizes of the switch domains (ranks in order), told to each rank as
    testbed run does (TESTBED_SWITCH_INDEX, _RANK, _SIZE, TESTBED_SWITCH)."""
    port = free_port()
    procs, logs, starts = [], [], []
    zygote = None
    if world >= zygotes.MIN_RANKS and zygotes.serves(module) and zygotes.enabled():
        out.mkdir(parents=True, exist_ok=True)
        zygote = zygotes.Zygote(out, module)
    where = [(g, i, n) for g, n in enumerate(domains or []) for i in range(n)]
    assert not domains or len(where) == world
    for r in range(world):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                 # NCCL as testbed run sets it (over TCP, each rank its own "host", so ranks
                 # may share one GPU), here on loopback
                 NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1", NCCL_NET="Socket", NCCL_HOSTID=f"test-rank{r}",
                 NCCL_MULTI_RANK_GPU_ENABLE="1",
                 # -P (below) leaves the directory out of the import path: the tree under
                 # test goes first by name, not whatever checkout the venv installed
                 PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        e.update({k: v.replace("{rank}", str(r)) for k, v in (env or {}).items()})  # a file per rank
        if domains:
            g, i, n = where[r]
            e.update(TESTBED_SWITCH_INDEX=str(g), TESTBED_SWITCH_RANK=str(i), TESTBED_SWITCH_SIZE=str(n),
                     TESTBED_SWITCH=f"s{g + 1}")
        argv = [module, "--out", str(out), *args]
        starts.append((zygote.client(argv, e) if zygote else argv, e))  # (argv, env) per rank
    rcs = []
    try:
        if zygote:
            zygote.start([e for _, e in starts], {DIE_WITH_PARENT: str(os.getpid())})
        for r, (argv, e) in enumerate(starts):
            log = out.parent / f"{out.name}.rank{r}.log"
            logs.append(log)
            f = open(log, "w")
            # -P as `testbed run` starts ranks: the zygote's import path, so it serves them
            procs.append((subprocess.Popen(python_argv(*argv), cwd=ROOT, env=e, stdout=f,
                                           stderr=subprocess.STDOUT), f))
        for p, f in procs:
            rcs.append(p.wait(timeout=timeout))
            f.close()
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if zygote:
            zygote.stop()
    return Result(out, rcs, [Path(log).read_text() for log in logs])
