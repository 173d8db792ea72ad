"""What a run measures besides its records' counters: DDP's per-iteration compute and
communication times, and the process's peak memory."""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel as DDP


class DDPTimes:
    """This iteration's forward/backward compute and communication seconds, from DDP's own
    runtime timers (they see every bucket's collective, with or without a hook)."""

    def __init__(self, ddp: DDP):
        self._ddp = ddp
        try:
            ddp._set_ddp_runtime_logging_sample_rate(1)  # time every iteration
            self._ok = True
        except (AttributeError, RuntimeError):  # private API moved: record nulls
            self._ok = False

    def read(self) -> tuple[float | None, float | None, float | None]:
        if not self._ok:
            return None, None, None
        logger = self._ddp.logger
        assert logger is not None  # DDP made it (setting the sample rate above used it)
        logger.set_runtime_stats_and_log()
        d = self._ddp._get_ddp_logging_data()
        ns = 1e-9
        compute = (d.get("forward_compute_time", 0) + d.get("backward_compute_time", 0)) * ns
        return compute, d.get("backward_comm_time", 0) * ns, d.get("backward_compute_comm_overlap_time", 0) * ns


def max_rss_bytes() -> float:
    """This process's peak resident memory (Linux reports kilobytes)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def pss_bytes() -> float | None:
    """This process's proportional set size now: its private memory plus its share of what
    it shares with others (torch's libraries, mapped once for every rank). Summed over ranks
    it is the memory they hold together, which a sum of resident sizes overstates (each
    counts the shared pages whole). None where /proc/self/smaps_rollup is missing."""
    try:
        with open("/proc/self/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        return None
    return None

