"""Start N ``python -m workloads.train`` processes with torchrun's environment (for tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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
    procs, logs = [], []
    where = [(g, i, n) for g, n in enumerate(domains or []) for i in range(n)]
    assert not domains or len(where) == world
    for r in range(world):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                 # NCCL as testbed run sets it (over TCP, each rank its own "host", so ranks
                 # may share one GPU), here on loopback
                 NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1", NCCL_NET="Socket", NCCL_HOSTID=f"test-rank{r}",
                 NCCL_MULTI_RANK_GPU_ENABLE="1")
        e.update({k: v.replace("{rank}", str(r)) for k, v in (env or {}).items()})  # a file per rank
        if domains:
            g, i, n = where[r]
            e.update(TESTBED_SWITCH_INDEX=str(g), TESTBED_SWITCH_RANK=str(i), TESTBED_SWITCH_SIZE=str(n),
                     TESTBED_SWITCH=f"s{g + 1}")
        log = out.parent / f"{out.name}.rank{r}.log"
        logs.append(log)
        f = open(log, "w")
        procs.append((subprocess.Popen([sys.executable, "-m", module, "--out", str(out), *args], cwd=ROOT,
                                       env=e, stdout=f, stderr=subprocess.STDOUT), f))
    rcs = []
    try:
        for p, f in procs:
            rcs.append(p.wait(timeout=timeout))
            f.close()
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return Result(out, rcs, [Path(log).read_text() for log in logs])
