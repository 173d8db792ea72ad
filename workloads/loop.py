"""The iterations of one run: step, record, evaluate, until the last iteration or the target.

Every duration it records is in emulated seconds: the measured one divided by ``--dilation``
(1 unless ``testbed run --dilation K`` slowed the links and the stated compute K-fold).

``Loop`` holds what the iterations touch (built by ``workloads.train.train``); ``run()``
returns the ``Progress`` the summary is made of. Per iteration, in order: one optimizer
step through DDP and the scheme's hook (``step``), its record line and log line
(``record``), and, every ``--eval-every`` iterations, an evaluation (``evaluate``).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn as nn

from workloads import arguments, collectives, compat, data, records
from workloads.evaluation import evaluate, sync_buffers
from workloads.measure import DDPTimes
from workloads.pacing import Pacer

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.lr_scheduler import LRScheduler


@dataclass
class Progress:
    """What the iterations did (the summary reads it)."""

    iterations: int = 0
    train_s: float = 0.0
    """Training seconds, evaluations excluded."""
    iter_s: list[float] = field(default_factory=list)
    payloads: list[int] = field(default_factory=list)
    """Bytes this rank handed to collectives, per iteration."""
    accuracy: float | None = None
    """Of the last evaluation."""
    time_to_target_s: float | None = None
    reached_target: bool = False
    """--stop-at-target and the target is reached: stop."""
    overruns: int = 0
    """--gpu-time: iterations whose real compute missed a deadline (``workloads.pacing``)."""
    late_max_s: float = 0.0
    """--gpu-time: the latest miss, real seconds."""
    real_compute_max_s: float = 0.0
    """--gpu-time: the longest real compute of an iteration, real seconds."""
    need_max: float = 0.0
    """--gpu-time: the pacer's largest ``need`` (K x it meets every deadline)."""


class SchemeState(Protocol):
    """What the loop asks of a scheme's state (``workloads.schemes``); it may also have
    ``before_step()`` and ``after_step(optimizer)``, which the loop calls where present."""

    def take_payload_bytes(self) -> int: ...


@dataclass
class Loop:
    args: argparse.Namespace
    ds: data.Dataset
    rank: int
    world: int
    device: torch.device
    model: nn.Module
    """The model itself (evaluated; the DDP module is ``synthetic`` in a --compute-time run)."""
    ddp: DistributedDataParallel
    state: SchemeState
    """The scheme's state (``take_payload_bytes``, optional ``before_step``/``after_step``)."""
    opt: torch.optim.Optimizer
    sched: LRScheduler | None
    timers: DDPTimes
    synthetic: nn.Module | None
    total: int
    per_epoch: int
    counters: records.IfaceCounters | None = None
    it_log: records.JsonlWriter | None = None
    ev_log: records.JsonlWriter | None = None
    pacer: Pacer | None = None
    """--gpu-time: the real compute held to K x T per iteration."""

    def run(self) -> Progress:
        """Epochs of iterations until ``total`` (or the target, with --stop-at-target)."""
        progress = Progress()
        aug = torch.Generator().manual_seed(self.args.seed * 1000 + self.rank)
        eval_every = self.args.eval_every or self.per_epoch
        epoch = 0
        while True:
            for x, y in self._batches(epoch, aug):
                dt, loss = self.step(x, y)
                dt /= self.args.dilation  # emulated seconds (--dilation K: everything ran K times slower)
                self.record(progress, epoch, dt, loss)
                if self.synthetic is None and (progress.iterations % eval_every == 0
                                               or progress.iterations == self.total):
                    self.evaluate(progress, epoch)
                if progress.iterations >= self.total or progress.reached_target:
                    return progress
                if progress.iterations == 1:
                    # DDP rebuilds its buckets once, at the start of the second iteration (two
                    # broadcasts of bucket indices); done here, off the clock and aside from the
                    # training's exchange (a hook that exchanges nothing has no collective left)
                    with collectives.aside():
                        compat.rebuild_buckets_now(self.ddp)
            epoch += 1

    def _batches(self, epoch: int, aug: torch.Generator):
        if self.synthetic is None:
            return data.batches(self.ds, self.rank, self.world, epoch, self.args.seed, self.args.batch_size, aug)
        return ((None, None) for _ in range(self.total))

    def step(self, x, y) -> tuple[float, float]:
        """One optimizer step: (seconds, this rank's loss)."""
        before_step = getattr(self.state, "before_step", None)
        after_step = getattr(self.state, "after_step", None)
        collectives.iteration()  # the proof counts this iteration's gradient volume from here
        t0 = time.perf_counter()
        if self.pacer:
            self.pacer.start()
        self.opt.zero_grad(set_to_none=True)
        if self.synthetic is None:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            loss = nn.functional.cross_entropy(self.ddp(x), y)
        else:
            loss = self.ddp()  # sleeps the stated forward time; backward: the stated rest
        if self.pacer:
            self.pacer.forward_done()  # held to its deadline; the backward's are in the pacer's hooks
        loss.backward()  # DDP's hooks communicate; returns when all buckets are reduced
        if before_step:
            before_step()
        if self.synthetic is None:  # (a synthetic run's optimizer step is part of the stated time)
            self.opt.step()
        if after_step:
            after_step(self.opt)
        if self.sched:
            self.sched.step()
        loss_v = loss.item()  # synchronises the device
        return time.perf_counter() - t0, loss_v

    def record(self, progress: Progress, epoch: int, dt: float, loss: float) -> None:
        """Count the iteration; its record line (``--out``) and log line (rank 0, ``--log-every``)."""
        progress.iterations += 1
        it = progress.iterations
        progress.train_s += dt
        compute_s, comm_s, overlap_s = (None if t is None else t / self.args.dilation for t in self.timers.read())
        payload = self.state.take_payload_bytes()
        progress.iter_s.append(dt)
        progress.payloads.append(payload)
        late = None
        if self.pacer:
            progress.overruns += self.pacer.overran()
            progress.late_max_s = max(progress.late_max_s, self.pacer.late)
            progress.real_compute_max_s = max(progress.real_compute_max_s, self.pacer.real)
            progress.need_max = max(progress.need_max, self.pacer.need)
            late = self.pacer.late / self.args.dilation
        recorded: float | None = loss
        if self.synthetic is not None:
            recorded = None  # no loss without a forward pass
        elif not math.isfinite(loss):
            raise ValueError(f"loss is {loss} at iteration {it}; lower --lr")
        if self.it_log:
            tx, rx = self.counters.read() if self.counters else (None, None)
            buffers = getattr(self.state, "buffer_bytes", None)
            self.it_log.write({"rank": self.rank, "iter": it, "epoch": epoch, "time": time.time(), "iter_s": dt,
                               "compute_s": compute_s, "comm_s": comm_s, "overlap_s": overlap_s, "loss": recorded,
                               "payload_bytes": payload, "buffer_bytes": buffers[-1] if buffers else None,
                               "tx_bytes": tx, "rx_bytes": rx, "paced_late_s": late})
        if self.rank == 0 and self.args.log_every and it % self.args.log_every == 0:
            print(f"epoch {epoch} iter {it}/{self.total} loss {recorded if recorded is None else round(recorded, 4)} "
                  f"{dt * 1000:.0f} ms "
                  f"payload {payload} B", flush=True)

    def evaluate(self, progress: Progress, epoch: int) -> None:
        """Test accuracy now (all ranks), time to the target, the evaluation record (rank 0)."""
        with collectives.aside():  # its collectives are not the training's exchange
            sync_buffers(self.model, self.world)
            acc, test_loss = evaluate(self.model, self.ds, self.rank, self.world, self.device)
        progress.accuracy = acc
        target = arguments.target(self.args)
        if target is not None and progress.time_to_target_s is None and acc >= target:
            progress.time_to_target_s = progress.train_s
        if self.rank == 0:
            print(f"eval: iteration {progress.iterations} accuracy {acc:.4f} loss {test_loss:.4f}", flush=True)
            if self.ev_log:
                self.ev_log.write({"iter": progress.iterations, "epoch": epoch, "time": time.time(),
                                   "train_s": progress.train_s, "accuracy": acc, "loss": test_loss})
        if progress.time_to_target_s is not None and self.args.stop_at_target:
            progress.reached_target = True
