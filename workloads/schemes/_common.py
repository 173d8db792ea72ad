"""Pieces shared by the hooks: payload accounting, bucket identity, ternary quantisation."""

import itertools
import queue
import threading

import torch
import torch.distributed as dist


class Accounting:
    """Counts the bytes this rank hands to collectives (its input tensors)."""

    payload_bytes: int = 0

    def take_payload_bytes(self) -> int:
        """Bytes since the last call (the train loop calls it once per iteration)."""
        b, self.payload_bytes = self.payload_bytes, 0
        return b


class BucketKeys:
    """Identify a DDP bucket by its parameters' identities.

    DDP rebuilds its buckets once (start of iteration 2): indices, lengths and membership
    change, so per-bucket state must be keyed by the parameters a bucket holds. The key is
    built from the parameters on every call: a cheaper key (index, buffer address, length)
    can alias across the rebuild when the allocator hands the new bucket the old one's
    memory (likely on CUDA's caching allocator), and then a bucket would take another's
    residuals or masks. Walking the parameters costs about 5 us per iteration for all of
    ResNet18's 62 tensors (0.1 us each) against milliseconds of communication.
    """

    def __call__(self, bucket) -> tuple[int, ...]:
        return tuple(map(id, bucket.parameters()))


class CommThread:
    """Runs a hook's communication off the backward pass: one thread per state, started at
    the first ``submit``, running the submitted works one after another in the order they
    were submitted. DDP calls the hook in bucket order on every rank, so every rank issues
    the same collectives in the same order, as the synchronous hook did; meanwhile backward
    goes on computing the next buckets' gradients (DDP waits on the futures at its end).

    A thread, not chained futures: a multi-step algorithm (SparDL's rounds, PruneX's
    domain reduce -> leaders' exchange -> broadcast) needs each step's data for the next,
    and the step would then run in a callback on the thread that completed the previous
    collective, a gloo worker: issuing and waiting on collectives there can deadlock once
    the worker threads are all taken, and with several buckets in flight their callbacks
    would issue a group's collectives in a different order on different ranks. Here the
    works are the synchronous code itself, so the results are those of the synchronous hook.

    After a work fails, the peers are likely gone: every later future fails at once with
    the same error (DDP sees it and stops rather than hanging).
    """

    def __init__(self, name: str = "hook-comm"):
        self.name = name
        self._queue: queue.SimpleQueue | None = None
        self._error: BaseException | None = None

    def submit(self, work, device: torch.device | None = None) -> torch.futures.Future:
        """A future of ``work()``'s result, run on the thread after every earlier work."""
        cuda_device = device if device is not None and device.type == "cuda" else None
        fut: torch.futures.Future = torch.futures.Future(devices=[cuda_device] if cuda_device is not None else None)
        ready = None
        if cuda_device is not None:  # the bucket's gradients are written on this (autograd's) stream
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(cuda_device))
        if self._queue is None:
            self._queue = queue.SimpleQueue()
            threading.Thread(target=self._serve, name=self.name, daemon=True).start()
        self._queue.put((work, fut, cuda_device, ready))
        return fut

    def _serve(self) -> None:
        q = self._queue
        assert q is not None  # made before this thread was started
        while True:
            work, fut, device, ready = q.get()
            result = None
            if self._error is None:
                try:
                    if device is None:
                        result = work()
                    else:
                        with torch.cuda.device(device):
                            torch.cuda.current_stream(device).wait_event(ready)
                            result = work()
                except Exception as e:  # noqa: BLE001 (handed to DDP through the future)
                    self._error = e
            if self._error is not None:
                fut.set_exception(self._error)
            else:
                fut.set_result(result)


def done_future(value: torch.Tensor) -> torch.futures.Future:
    """A future already holding ``value`` (a synchronous hook's answer)."""
    fut: torch.futures.Future = torch.futures.Future(devices=[value.device] if value.is_cuda else None)
    fut.set_result(value)
    return fut


def bucket_residual(state, key: tuple, bucket, buf: torch.Tensor) -> torch.Tensor:
    """The bucket's error-feedback residual (``state.residuals``: bucket key -> tensor,
    ``state.where``: id(parameter) -> (key, offset, length)); a new bucket takes over its
    parameters' residuals from the old ones (DDP rebuilds its buckets after iteration 1)."""
    residual = state.residuals.get(key)
    if residual is not None:
        return residual
    residual = state.residuals[key] = torch.zeros_like(buf)
    base, size = buf.data_ptr(), buf.element_size()
    left = set()
    for p, g in zip(bucket.parameters(), bucket.gradients()):  # gradients are views into buf
        off, n = (g.data_ptr() - base) // size, g.numel()
        old = state.where.get(id(p))
        if old is not None:
            okey, ooff, _ = old
            residual[off:off + n] = state.residuals[okey][ooff:ooff + n]
            left.add(okey)
        state.where[id(p)] = (key, off, n)
    for okey in left - {k for k, _, _ in state.where.values()}:
        del state.residuals[okey]  # every parameter of that old bucket has moved
    return residual


def ternarize(x: torch.Tensor, scale: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Stochastic ternary quantisation: sign(x) * Bernoulli(|x| / scale), as int8.

    ``scale * ternarize(x, scale)`` is an unbiased estimate of ``x`` when scale >= max |x|
    (a zero scale means x is all zeros, and so is the result).
    """
    # keep x when |x| > u * scale, u ~ U[0, 1): probability min(|x| / scale, 1), the same
    # event as u < |x| / scale without a division, a sign or a float product; comparisons
    # give bools, and bools viewed as int8 subtract to {-1, 0, 1} (4x faster on a CPU)
    r = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    r.mul_(torch.as_tensor(scale, dtype=x.dtype, device=x.device))
    up = torch.gt(x, r)
    return up.view(torch.int8).sub_(torch.lt(x, r.neg_()).view(torch.int8))


def segments_of(bucket, buf: torch.Tensor, kept: dict | None = None) -> list[tuple[int, int]]:
    """(offset, length) of each parameter's gradient in the bucket's flat buffer, in order.

    With ``kept`` (id(parameter) -> number of kept entries), the segments of PacTrain's
    compact buffer instead: each parameter's kept entries, packed one after another.
    """
    if kept is not None:
        out, off = [], 0
        for p in bucket.parameters():
            n = kept[id(p)]
            out.append((off, n))
            off += n
        return out
    base, size = buf.data_ptr(), buf.element_size()
    out = [((g.data_ptr() - base) // size, g.numel()) for g in bucket.gradients()]
    if [o for o, _ in out] != [sum(n for _, n in out[:i]) for i in range(len(out))] or \
            sum(n for _, n in out) != buf.numel():
        return [(0, buf.numel())]  # not packed end to end (never seen): one scale for the bucket
    return out


class MaxExchange:
    """Element-wise MAX of small CPU tensors over a process group's ranks, by dissemination
    (Hensgen, Finkel and Manber, 1988): in round k each rank sends to rank + 2^k and receives
    from rank - 2^k (mod n) and keeps the maximum; after ceil(log2 n) rounds every rank holds
    the maximum over all (MAX is idempotent, so any n works, not only powers of two).

    Gloo's all_reduce is a ring: 2 (n - 1) steps, each a latency-bound message of a few
    bytes. For TernGrad's scales (4 bytes per layer) that latency is the whole cost: 8 ranks
    on three_switch, 16 floats, 19.3 ms per all_reduce MAX against 3.9 ms in 3 rounds
    (``benchmarks/scale_exchange.py``). NCCL's small all-reduce is latency-optimised
    already; this is for gloo.

    Exchanges run one after another on a thread of their own, in the order they were
    submitted (every rank submits in the same order, as DDP calls hooks in bucket order), so
    a submitter never waits; ``then(tensor, error)`` runs on that thread when one is done.
    """

    def __init__(self, group=None):
        self.group = group
        self.ranks = list(range(dist.get_world_size())) if group is None else dist.get_process_group_ranks(group)
        self.me = self.ranks.index(dist.get_rank())
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        threading.Thread(target=self._serve, name="ternary-scales", daemon=True).start()

    def submit(self, tensor: torch.Tensor, then) -> None:
        self._queue.put((tensor, then))

    def _serve(self) -> None:
        seq = 0
        while True:
            tensor, then = self._queue.get()
            if self._error is None:  # after a failure the peers are gone: fail the rest at once
                try:
                    self._max(tensor, seq)
                except Exception as e:  # noqa: BLE001 (handed to DDP through ``then``)
                    self._error = e
            then(tensor, self._error)
            seq += 1

    def _max(self, v: torch.Tensor, seq: int) -> None:
        n = len(self.ranks)
        other = torch.empty_like(v)
        step, rnd = 1, 0
        while step < n:
            tag = (seq % (1 << 20)) * 32 + rnd
            send = dist.isend(v.clone(), self.ranks[(self.me + step) % n], group=self.group, tag=tag)
            assert send is not None  # (None only for a rank outside the group)
            dist.recv(other, self.ranks[(self.me - step) % n], group=self.group, tag=tag)
            send.wait()
            torch.maximum(v, other, out=v)
            step, rnd = step * 2, rnd + 1


class TernaryReducer:
    """TernGrad's average of a flat buffer made of layers, with one scale per layer.

    For each segment j of the buffer (a parameter tensor's gradient, or its kept entries in
    PacTrain's compact buffer), as in TernGrad (Wen et al., 2017, Sec. 3.2-3.3): clip to
    ``clip`` standard deviations of that layer (0: off), take m_j = max |g_j|, agree on
    s_j = max over ranks of m_j (one all-reduce MAX of the bucket's L scales: 4 L bytes),
    send sign(g) * Bernoulli(|g| / s_j) as int8, sum the int8 values (exact up to 127
    ranks) and average: s_j / world * sum. Unbiased for the clipped gradient of every layer,
    and a layer of small gradients is not quantised against a large layer's scale.

    The scale exchange does not serialise the backward pass: ``reduce`` launches the scale
    exchange (on gloo ``MaxExchange``'s dissemination rounds, on NCCL an all-reduce MAX)
    and returns a future at once; when the scales arrive, a callback quantises and launches
    the int8 all-reduce. Scales and int8 sums travel on two process groups of
    their own, and the int8 all-reduces are launched strictly in the order of ``reduce``
    calls (DDP calls the hook in bucket order on every rank), so every rank issues the same
    collectives in the same order whichever scale exchange completes first.
    """

    def __init__(self, group=None, generator: torch.Generator | None = None, clip: float = 2.5):
        self.world = dist.get_world_size(group)
        if self.world > 127:
            raise ValueError(f"ternary int8 sums overflow beyond 127 ranks (world size {self.world})")
        ranks = None if group is None else dist.get_process_group_ranks(group)
        # collective calls: every rank constructs its reducer at the same point (attach)
        self.scale_group = dist.new_group(ranks)
        self.value_group = dist.new_group(ranks)
        self.exchange = MaxExchange(self.scale_group) if dist.get_backend(self.scale_group) == "gloo" else None
        self.generator = generator
        self.clip = clip
        self._lock = threading.Lock()
        self._calls = 0
        self._launched = 0
        self._ready: dict[int, tuple] = {}
        self._layouts: dict[tuple, torch.Tensor | bool] = {}
        self.vectorise: bool | None = None
        """Whole-buffer segment operations instead of a loop over layers (None: on CUDA only)."""

    def _lengths(self, segments, device) -> torch.Tensor | None:
        """The segments' lengths as a tensor on ``device`` (cached per bucket layout), or
        None when they do not tile the buffer from 0 in order (then the per-layer loop)."""
        key = (tuple(segments), str(device))
        hit = self._layouts.get(key)
        if hit is None:
            ends = itertools.accumulate((n for _, n in segments), initial=0)
            tiled = all(off == end for (off, _), end in zip(segments, ends))
            hit = self._layouts[key] = (torch.tensor([n for _, n in segments], dtype=torch.long, device=device)
                                        if tiled and segments else False)
        return hit if isinstance(hit, torch.Tensor) else None  # False: not tiled

    def _layout(self, values: torch.Tensor, segments) -> torch.Tensor | None:
        """The lengths tensor when the whole-buffer path applies to ``values``, else None."""
        if not (values.is_cuda if self.vectorise is None else self.vectorise):
            return None
        lengths = self._lengths(segments, values.device)
        return lengths if lengths is not None and values.numel() == sum(n for _, n in segments) else None

    def _clip_and_scale(self, values: torch.Tensor, segments) -> torch.Tensor:
        """Clip each segment to ``clip`` of its standard deviations, in place; the segments'
        max |value|.

        On a GPU, a bucket's layers in a handful of whole-buffer operations (segment
        reductions, per-element bounds expanded with repeat_interleave): the per-layer loop's
        small kernels cost more than the backward pass there (ResNet18 on an H100: the
        ternary hook took 1.3x backward). On a CPU the loop is faster (repeat_interleave is
        an index_select there: ResNet18's 11 M entries took 0.71 s vectorised, 0.19 s looped)."""
        lengths = self._layout(values, segments)
        if lengths is None:
            return self._clip_and_scale_loop(values, segments)
        total = values.numel()
        if self.clip > 0:
            mean = torch.segment_reduce(values, "mean", lengths=lengths, unsafe=True, initial=0)
            dev = values - mean.repeat_interleave(lengths, output_size=total)
            var = torch.segment_reduce(dev.square_(), "sum", lengths=lengths, unsafe=True, initial=0)
            del dev
            c = (var / (lengths - 1).clamp_min(1)).sqrt_() * self.clip
            # a constant layer, or one of a single entry, is not clipped
            c = torch.where((c > 0) & (lengths > 1), c, torch.full_like(c, float("inf")))
            c = c.repeat_interleave(lengths, output_size=total)
            torch.clamp(values, min=-c, max=c, out=values)
            del c
        return torch.segment_reduce(values.abs(), "max", lengths=lengths, unsafe=True, initial=0).float()

    def _clip_and_scale_loop(self, values: torch.Tensor, segments) -> torch.Tensor:
        scales = []
        for off, n in segments:
            v = values[off:off + n]
            if n == 0:
                scales.append(values.new_zeros(()))
                continue
            if self.clip > 0 and n > 1:
                c = v.std() * self.clip
                c = torch.where(c > 0, c, torch.full_like(c, float("inf")))  # a constant layer stays
                torch.clamp(v, min=-c, max=c, out=v)
            scales.append(v.abs().amax())
        return torch.stack(scales).float() if scales else values.new_zeros(0, dtype=torch.float32)

    def _per_element(self, per_segment: torch.Tensor, values: torch.Tensor, segments) -> torch.Tensor | None:
        lengths = self._layout(values, segments)
        if lengths is None:
            return None
        return per_segment.to(values.dtype).repeat_interleave(lengths, output_size=values.numel())

    def reduce(self, values: torch.Tensor, segments: list[tuple[int, int]]) -> tuple[torch.futures.Future, int]:
        """Average ``values`` (clipped in place) over ranks; (future of the average, bytes sent)."""
        scales = self._clip_and_scale(values, segments)
        seq = self._calls
        self._calls += 1
        result: torch.futures.Future = torch.futures.Future(devices=[values.device] if values.is_cuda else None)

        def on_scales(agreed, error):
            try:
                if error is not None:
                    raise error
                with self._lock:
                    self._ready[seq] = (values, segments, agreed, result)
                    while self._launched in self._ready:
                        self._launch(*self._ready.pop(self._launched))
                        self._launched += 1
            except Exception as e:  # noqa: BLE001 (DDP must see it, not hang)
                if not result.done():
                    result.set_exception(e)

        if self.exchange is not None and not scales.is_cuda:
            self.exchange.submit(scales, on_scales)
        else:
            fut = dist.all_reduce(scales, op=dist.ReduceOp.MAX, group=self.scale_group, async_op=True).get_future()

            def unpack(f):
                try:
                    agreed, error = f.value()[0], None
                except Exception as e:  # noqa: BLE001
                    agreed, error = None, e
                on_scales(agreed, error)

            fut.then(unpack)
        return result, scales.numel() * scales.element_size() + values.numel()

    def _launch(self, values, segments, agreed, result) -> None:
        try:
            scale = self._per_element(agreed, values, segments)
            if scale is not None:
                q = ternarize(values, scale, self.generator)
            else:
                q = torch.empty(values.shape, dtype=torch.int8, device=values.device)
                for j, (off, n) in enumerate(segments):
                    q[off:off + n] = ternarize(values[off:off + n], agreed[j], self.generator)
            del scale
            work = dist.all_reduce(q, group=self.value_group, async_op=True).get_future()
        except Exception as e:  # noqa: BLE001
            result.set_exception(e)
            return

        def done(f):
            try:
                total = f.value()[0]
                per = self._per_element(agreed / self.world, values, segments)
                if per is not None:
                    torch.mul(total, per, out=values)
                else:
                    for j, (off, n) in enumerate(segments):
                        torch.mul(total[off:off + n], agreed[j].to(values.dtype) / self.world,
                                  out=values[off:off + n])
                result.set_result(values)
            except Exception as e:  # noqa: BLE001
                result.set_exception(e)

        work.then(done)
