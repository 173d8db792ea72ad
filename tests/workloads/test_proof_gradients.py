"""A built-in run whose gradients never reached a collective is not ok, however generous the
links' counters: the real trainer in real gloo processes, its exchange broken three ways
(the topk hook returns without communicating, DDP's no_sync forever under a hook and under
DDP's own all-reduce), each issuing a 4-byte collective a step as a script that all-reduces
only its loss would; the proof (testbed.runs.proof.prove) must name the rank, the iteration
and the shortfall. The floors every honest scheme meets: tests/workloads/test_volume.py."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from testbed.runs.proof import prove
from workloads.collectives import RECORDER_ENTRIES

from .launch import ROOT, train

pytestmark = pytest.mark.slow

BROKEN = r'''
import sys
import torch, torch.distributed as dist
from workloads import loop, train
from workloads.schemes import topk

CASE = {case!r}
if CASE == "quiet":
    def quiet(state, bucket):  # the bucket comes back unaveraged: a token collective, no gradient
        dist.all_reduce(torch.zeros(1))
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    topk.topk_hook = quiet
else:
    step = loop.Loop.step
    def local_step(self, x, y):  # DDP never synchronises; only the loss, 4 bytes, is all-reduced
        with self.ddp.no_sync():
            out = step(self, x, y)
        dist.all_reduce(torch.zeros(1))
        return out
    loop.Loop.step = local_step
train._exit(train.main(sys.argv[1:]))
'''


@dataclass
class Link:
    index: int
    a: str
    b: str
    bottleneck: bool = False

    @property
    def name(self) -> str:
        return f"{self.a}-{self.b}"


@dataclass
class Topology:
    links: list


STAR = Topology([Link(0, "w0", "s0"), Link(1, "w1", "s0")])
PLENTY = 10**12
"""Bytes every link direction 'measured': the links' half of the proof passes whatever the run did."""


@pytest.mark.parametrize("case, scheme, shortfall", [
    ("quiet", "topk", r"its collectives carried 4 bytes, 43,604 short of the 43,608 bytes topk must move for "
                      r"its 545,098 gradient elements"),
    ("no_sync", "topk", r"DDP handed topk's hook 0 of the model's 545,098 gradient elements: 545,098 never "
                        r"reached a collective"),
    ("no_sync", "allreduce", r"its collectives carried 4 bytes, 2,180,388 short of the 2,180,392 bytes allreduce "
                             r"must move for its 545,098 gradient elements"),
], ids=["quiet-topk-hook", "no_sync-topk", "no_sync-allreduce"])
def test_a_built_in_run_whose_gradients_never_reach_a_collective_is_not_ok(tmp_path, case, scheme, shortfall):
    (tmp_path / "broken.py").write_text(BROKEN.format(case=case))
    env = {"TESTBED_COLLECTIVES": str(tmp_path / "collectives{rank}.json"),
           "TORCH_FR_BUFFER_SIZE": str(RECORDER_ENTRIES), "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    res = train(2, tmp_path / "run", "--scheme", scheme, "--max-iters", "3", "--eval-every", "3", module="broken",
                env=env)
    assert res.ok, res.logs
    start = {(i, d): {"bytes": 0} for i in range(2) for d in ("forward", "reverse")}
    end = {k: {"bytes": PLENTY} for k in start}
    proof = prove(tmp_path, STAR, {"w0": 0, "w1": 1}, start, end)
    assert proof["verdict"] == "unproven", proof  # the old proof: passed (4 bytes a step crossed the links)
    assert re.fullmatch(r"the gradients did not all reach the collectives: rank 0 iteration 1: " + shortfall
                        + r" \(and 5 more rank-iterations short\)", proof["reason"]), proof["reason"]
