"""Gradient-communication schemes, registered by name.

Each scheme module provides ``register(ddp_model, process_group, args) -> state | None``,
installing a DDP communication hook (or none, for plain all-reduce). The state object
exposes ``payload_bytes``: bytes this rank handed to collectives since the last reset.
"""

from __future__ import annotations

SCHEMES = ("allreduce", "fp16", "pactrain")


def check(name: str) -> str:
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme '{name}'; choose one of: {', '.join(SCHEMES)}")
    return name
