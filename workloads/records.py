"""Run directory records: per-rank iteration JSONL, evaluation JSONL, summary and config.

Every line is flushed as it is written, so a crash loses at most the iteration in flight.

Layout of ``--out DIR``::

    config.json          arguments, world size, backend, versions (rank 0)
    rank{R}.jsonl        one record per iteration of rank R (ITER_FIELDS)
    eval.jsonl           one record per evaluation (EVAL_FIELDS, rank 0)
    summary.json         the run's outcome (SUMMARY_FIELDS, rank 0, at the end)

The records contract (docs/workloads.md, "Your own script"): testbed tells every rank where
its records go in ``$TESTBED_RECORDS`` (``RECORDS_ENV``); one JSON object per line, any
subset of ``CONTRACT_FIELDS``. The built-in trainer's rank{R}.jsonl is that file and those
are its field names. :func:`record` is the optional helper a user's script may call.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

RECORDS_ENV = "TESTBED_RECORDS"
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS})
"""Write errors that are the disk's, not ours: a rank says which file and exits 3."""
CONTRACT_FIELDS = {
    "iter": "the step the record ends, from 1 (without it, records count in order)",
    "time": "Unix seconds at the end of the step (record() adds it)",
    "loss": "training loss of the step",
    "accuracy": "test accuracy (0-1) when the script evaluated; rank 0's are the run's",
    "payload_bytes": "bytes this rank handed to collectives in the step (the tc-counter proof uses them)",
    "iter_s": "seconds the step took",
}

ITER_FIELDS = {
    "rank": "this process's rank",
    "iter": "iteration number, from 1",
    "epoch": "epoch number, from 0",
    "time": "wall-clock time at the end of the iteration (Unix seconds)",
    "iter_s": "seconds for the whole iteration (data, forward, backward incl. communication, step)",
    "compute_s": "forward + backward computation seconds (DDP's own timers)",
    "comm_s": "seconds from the first bucket's collective to the last one's completion (DDP's timers)",
    "overlap_s": "part of comm_s that overlapped backward computation",
    "loss": "this rank's training loss on its batch",
    "payload_bytes": "bytes this rank handed to collectives in this iteration",
    "buffer_bytes": "prunex: bytes the switch leaders exchanged in this iteration (the buffer shrinks as channels "
                    "are compacted); null for other schemes",
    "tx_bytes": "interface transmit byte counter after the iteration (null without --iface)",
    "rx_bytes": "interface receive byte counter after the iteration (null without --iface)",
    "paced_late_s": "--gpu-time: how late this rank's real compute met its latest deadline, emulated seconds "
                    "(0: on time; over 10 % of the budget the iteration overran); null without --gpu-time",
}
EVAL_FIELDS = {
    "iter": "iterations completed",
    "epoch": "epoch number",
    "time": "wall-clock time (Unix seconds)",
    "train_s": "training seconds so far, evaluation excluded",
    "accuracy": "top-1 test accuracy over the whole test set (all ranks' shards)",
    "loss": "mean test loss",
}
SUMMARY_FIELDS = {
    "scheme": "", "model": "", "dataset": "", "world_size": "", "backend": "",
    "test_samples": "images the accuracy is measured on (one of them is 1 / test_samples of accuracy)",
    "iterations": "iterations run", "epochs": "epochs run (fractional if stopped early)",
    "wall_s": "seconds from the first iteration to the end, evaluations included",
    "train_s": "training seconds, evaluations excluded",
    "final_accuracy": "accuracy of the last evaluation",
    "target_accuracy": "--target-acc, else the data set's default when the run trains (digits: 0.9), else null",
    "time_to_target_s": "train_s at the first evaluation reaching the target, or null",
    "mean_iter_s": "mean iteration seconds (rank 0)",
    "median_iter_s": "median iteration seconds (rank 0)",
    "mean_payload_bytes": "mean over ranks and iterations of payload bytes per iteration",
    "final_payload_bytes": "mean over ranks of the last iteration's payload bytes",
    "dense_bytes": "bytes of all gradients (what allreduce sends per iteration)",
    "kept_fraction": "prunex: fraction of the pruned layers' weights kept at the end (else null)",
    "dense_iterations": "prunex: iterations whose leaders exchanged every gradient, none compacted; pactrain: "
                        "iterations that sent no bucket compact (else null)",
    "control_bytes": "prunex: bytes of the norm all-reduces of its projections; pactrain: of its mask agreements' "
                     "checksums; part of payload (else null)",
    "admm_updates": "prunex: H-SADMM's Z/U updates before the masks were fixed (else null)",
    "admm_every": "prunex: iterations between those updates, as run (else null)",
    "compaction_events": "prunex: ADMM projections after which dynamic compaction pruned a channel (else null)",
    "compacted_channels": "prunex: channels dynamic compaction pruned before the masks were fixed (else null)",
    "placement": "domains of ranks (groups, names, hosts): switches under testbed, machines under torchrun",
    "pss_bytes_all_ranks": "the ranks' proportional set sizes at the end, summed: the memory they hold together "
                           "(max_rss_bytes_all_ranks counts every shared page once per rank); null where unknown",
    "dilation": "time dilation K (1: none): every shaped link ran K times slower, the stated compute took K "
                "times longer, and every duration here is the measured one divided by K",
    "gpu_time_s": "--gpu-time: the GPU compute per iteration T the run stands for (null: none)",
    "compute_budget_s": "--gpu-time: K x T, what each iteration's real forward and backward were held to",
    "overruns": "--gpu-time: iterations whose real compute missed a deadline, summed over ranks (0: validated)",
}


def record(**fields) -> None:
    """Append one record to this rank's ``$TESTBED_RECORDS`` (nothing when it is unset, e.g.
    under plain torchrun): ``record(iter=i, loss=l, payload_bytes=n)``."""
    path = os.environ.get(RECORDS_ENV)
    if not path:
        return
    fields.setdefault("time", time.time())
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(fields, separators=(",", ":")) + "\n")
    except OSError as e:  # name the file (a write error alone does not)
        raise OSError(e.errno, e.strerror, path) from None


class JsonlWriter:
    """Appends records to ``path``, each flushed; a failed write (a full disk) raises an
    OSError that names the file and how many records before it are kept."""

    def __init__(self, path: Path):
        self.path, self.written = Path(path), 0
        self._f = open(path, "a", buffering=1, encoding="utf-8")

    def write(self, record: dict) -> None:
        try:
            self._f.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._f.flush()
        except OSError as e:
            raise OSError(e.errno, f"{e.strerror} ({self.written} records before are kept)", str(self.path)) from None
        self.written += 1

    def close(self) -> None:
        self._f.close()


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    except OSError as e:  # name the file (a write error alone does not)
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def iface_from_env(explicit: str | None) -> str | None:
    """--iface, else the interface gloo/NCCL are pinned to (first of a list, no =/^ prefix)."""
    name = explicit or os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME")
    if not name:
        return None
    name = name.split(",")[0].lstrip("=")
    return None if name.startswith("^") or not name else name


class IfaceCounters:
    """tx/rx byte counters of one interface, from /sys/class/net (the caller's namespace)."""

    def __init__(self, iface: str, sysfs: str = "/sys/class/net"):
        self.iface = iface
        base = Path(sysfs) / iface / "statistics"
        self._tx, self._rx = base / "tx_bytes", base / "rx_bytes"
        if not self._tx.exists():
            raise ValueError(f"--iface {iface}: no such interface here ({base} is missing); "
                             f"name the data-plane interface, e.g. eth0 inside a testbed node")

    def read(self) -> tuple[int, int]:
        return int(self._tx.read_text()), int(self._rx.read_text())
