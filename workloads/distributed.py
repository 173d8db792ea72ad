"""Joining the process group (torchrun's environment, or a group of one) and making the
run deterministic."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a group of one's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str) -> tuple[int, int, torch.device, str]:
    """Join the process group described by torchrun's environment (or a group of one)."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("--backend nccl needs a CUDA GPU, and torch sees none; use --backend gloo")
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return rank, world, device, backend


def set_determinism(seed: int, threads: int | None, deterministic: bool = True) -> None:
    """Seed, and (``deterministic``) make the compute deterministic. A synthetic run has no
    compute to make deterministic and leaves it off: ``use_deterministic_algorithms`` costs
    about a second of CPU per rank to import, and fills every new tensor (DDP's buckets of
    hundreds of MB included) with NaN."""
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    if threads:
        torch.set_num_threads(threads)
    elif "OMP_NUM_THREADS" not in os.environ:  # share the cores among this host's ranks
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
