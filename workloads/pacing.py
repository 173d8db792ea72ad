"""``--gpu-time T``: real training held to a GPU's speed, every iteration's compute K x T.

The forward and backward passes are real (real data, gradients and accuracy) but run on a
CPU, hundreds of times slower than the GPU they stand for. ``testbed run --dilation K``
slows every link K-fold and divides every recorded time by K; so the run is the GPU cluster
in slow motion as long as every iteration's compute takes exactly K x T. :class:`Pacer`
holds it there on the schedule :class:`workloads.synthetic.SyntheticCompute` sleeps for a
stated compute (so the two modes agree at equal T): the forward pass ends a third of the
budget after the iteration starts, and each parameter's gradient is handed to DDP at its
deadline in the backward's other two thirds, spread over the parameters by size in the
order the backward makes them. DDP then launches each bucket's collective when the GPU would have, and its overlap
with the rest of the backward is the GPU's, not the CPU's.

A deadline the real compute reaches late is a miss. An iteration whose real compute (the
waits left out) took longer than K x T, or that missed a deadline by more than ``TOLERANCE``
of it, is an **overrun**: the CPU could not keep up with K x T, so that iteration's timing is
the CPU's, not the emulated GPU's. Overruns are counted (with the
latest miss) per iteration and in the summary, and a run with any is not validated: raise K
until the CPU's real compute fits. The schedule spreads the backward by parameter size, as
the paper-scale mode does, while a CPU's (or a GPU's) backward spends its time by layer; so a
small parameter's slot can be missed with the whole compute inside the budget (hence the
looser gradient tolerance). The pacer keeps, per iteration, the share of the budget it needed
(``need``): K x ``need`` is the smallest K at which it would not have overrun, and the
summary's ``dilation_fits`` is its largest over ranks and iterations.
"""

from __future__ import annotations

import time

import torch.nn as nn

TOLERANCE = 0.10
"""A deadline (the forward's end, a gradient's slot) missed by more than this share of the
budget makes the iteration an overrun, and so does real compute (waits left out) longer than
the budget. Not tighter, because the schedule gives a small parameter a slot by its size, a
few microseconds, while the real backward of its layer takes milliseconds whatever K is: the
first convolution (a few hundred weights, the largest image) is the backward's last gradient,
so an iteration's compute ends a few ms of real time late however large K is (measured: 1-4 %
of K x T for the CNN at K x T = 0.8 s); a larger K shrinks that share."""
FORWARD_SHARE = 1 / 3
"""The forward pass's share of the budget, as SyntheticCompute's."""


class Pacer:
    """The budget ``seconds`` (K x T) per iteration for ``model``'s real forward and backward.

    Per iteration: :meth:`start` before the forward pass, :meth:`forward_done` after it,
    then the backward (each parameter's gradient waits for its deadline in a hook that runs
    before DDP's own); then ``late``, ``real`` and ``need`` describe the iteration and
    :meth:`overran` judges it."""

    def __init__(self, model: nn.Module, seconds: float):
        self.seconds = seconds
        params = [p for p in model.parameters() if p.requires_grad]
        total = sum(p.numel() for p in params)
        backward = seconds * (1 - FORWARD_SHARE)
        self._t0 = 0.0
        self.late = 0.0
        """Of the current iteration: the latest miss, seconds (0: every deadline met)."""
        self.real = 0.0
        """Of the current iteration: the real compute so far, seconds (the time since the start
        less the time slept waiting for deadlines)."""
        self._slept = 0.0
        self.need = 0.0
        """Of the current iteration: the budget's share it needed to be no overrun (<= 1: it
        was none; K x this is the smallest K at which it would not have been, the real
        compute's seconds being what they were): the real compute over the budget, the
        latest miss over its tolerance."""
        self._per_element = backward / total
        self._total = total
        self._ready = 0
        """Elements whose gradients were handed over this iteration."""
        for p in params:
            p.register_post_accumulate_grad_hook(self._handed)

    def _handed(self, param) -> None:
        """A gradient is ready: it is due once the backward's share of every gradient ready so
        far has elapsed (in the order autograd makes them, which is not quite the parameters'
        reverse order: a layer's weight and bias come in either order)."""
        self._ready += param.numel()
        self._wait(self.seconds * FORWARD_SHARE + self._ready * self._per_element)
        if self._ready >= self._total:
            self.need = max(self.need, self.real / self.seconds, self.late / (TOLERANCE * self.seconds))

    def _wait(self, offset: float) -> None:
        """Sleep until ``offset`` after the start, or note how late it already was."""
        now = time.perf_counter()
        self.real = max(self.real, now - self._t0 - self._slept)
        due = self._t0 + offset
        if now < due:
            time.sleep(due - now)
            self._slept += time.perf_counter() - now
        else:
            self.late = max(self.late, now - due)

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self.late = self.real = self._slept = self.need = 0.0
        self._ready = 0

    def forward_done(self) -> None:
        self._wait(self.seconds * FORWARD_SHARE)

    def overran(self) -> bool:
        return self.real > self.seconds or self.late > TOLERANCE * self.seconds
