"""The machine a results page names: read where the benchmark ran, not where it is archived.

    python -m benchmarks.machine > machine.json     # on the machine that measures (a lent GPU one)
    python -m benchmarks.archive DIR... --name NAME --machine machine.json

Without ``--machine`` the archive names the machine it runs on, which is right when it
runs where the records were made. A results folder measured elsewhere (the device tool's
GPU machine, whose outputs are archived here) names that machine by this file instead.
Fields: CPUs, CPU model, memory, kernel and, where ``nvidia-smi`` lists any, the GPUs and
their driver; no host name. A field that was not read is left out, and the page says "not recorded".
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.common.files import InputError, read_json
from testbed.nodes.gpus import gpu_names, smi

FIELDS = {"cpus": int, "cpu_model": str, "memory_gb": (int, float), "kernel": str, "gpus": list, "gpu_driver": str}
UUID = re.compile(r"\s*\(UUID:[^)]*\)")


def describe() -> dict:
    """This machine: CPUs, memory, kernel, GPUs (their names as ``nvidia-smi -L`` gives them, less the UUID)."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    out = {"cpus": os.cpu_count(), "cpu_model": model, "memory_gb": round(mem / 1e9, 1), "kernel": platform.release()}
    gpus = [UUID.sub("", g) for g in gpu_names()]
    if not gpus:
        return out
    try:
        r = subprocess.run([smi() or "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        driver = r.stdout.split()[0] if r.returncode == 0 and r.stdout.split() else ""
    except (OSError, subprocess.SubprocessError):
        driver = ""
    return {**out, "gpus": gpus, **({"gpu_driver": driver[:40]} if driver else {})}


def load(path: Path) -> dict:
    """A machine file written by :func:`describe` elsewhere, read as hostile input: a regular
    file of bounded size, only the known fields, each of its type (strings short, GPUs a list
    of them)."""
    try:
        data = read_json(path, "json", "machine file")
    except (OSError, ValueError, InputError) as e:
        raise TestbedError(f"--machine {path}: {getattr(e, 'message', None) or e}",
                           "give the JSON that `python -m benchmarks.machine` printed there") from None
    if not isinstance(data, dict):
        raise TestbedError(f"--machine {path}: not a JSON object", "give what `python -m benchmarks.machine` printed")
    for key, value in data.items():
        kind = FIELDS.get(key)
        if kind is None:
            raise TestbedError(f"--machine {path}: unknown field {key!r}", f"fields: {', '.join(FIELDS)}")
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if key == "gpus":
            ok = ok and all(isinstance(g, str) and len(g) <= 200 for g in value) and len(value) <= 64
        if not ok or (isinstance(value, str) and len(value) > 200):
            raise TestbedError(f"--machine {path}: field {key!r} is not a {getattr(kind, '__name__', 'number')}",
                               "give what `python -m benchmarks.machine` printed")
    return data


def line(m: dict) -> str:
    """The machine as a results page's provenance line names it."""
    if not m:
        return "not recorded"
    mem = f"{m['memory_gb']} GB" if "memory_gb" in m else "memory not recorded"
    gpus = m.get("gpus") or []
    named = sorted(set(g.split(": ", 1)[-1] for g in gpus))
    driver = f", driver {m['gpu_driver']}" if m.get("gpu_driver") else ""
    gpu = f", {len(gpus)} GPU{'s' * (len(gpus) != 1)} ({', '.join(named)}{driver})" if gpus else ""
    return f"{m.get('cpus')} CPUs ({m.get('cpu_model') or '?'}), {mem}{gpu}"


if __name__ == "__main__":
    json.dump(describe(), sys.stdout, indent=1)
    print()
