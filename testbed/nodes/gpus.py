"""The host's GPUs, as the driver lists them."""

from __future__ import annotations

import os
import shutil
import subprocess


def smi() -> str | None:
    """The driver's ``nvidia-smi``, also where containers' images put it; None without one."""
    return shutil.which("nvidia-smi", path=os.defpath + ":/usr/local/nvidia/bin:/usr/local/bin")


def gpu_names() -> list[str]:
    """The host's NVIDIA GPUs as ``nvidia-smi -L`` lists them ("GPU 0: ..."); [] without a driver."""
    smi_path = smi()
    if smi_path is None:
        return []
    try:
        r = subprocess.run([smi_path, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [x for x in r.stdout.splitlines() if x.startswith("GPU ")] if r.returncode == 0 else []


def host_gpus() -> list[int]:
    """Indices of the NVIDIA GPUs this host has."""
    return list(range(len(gpu_names())))
