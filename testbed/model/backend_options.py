"""What each backend takes in a topology file, checked as the file is loaded.

The topology file is a user-facing contract, so the keys a backend takes on a worker (and
under ``defaults:``) are declared with the model, as containerlab declares every node key
in its topology types: the loader checks them without importing the backends (no netlink,
no Docker SDK). A backend in :mod:`testbed.nodes` reads the validated options from
``node.options``. A built-in backend with keys of its own adds its :class:`Options` here and
one line to :data:`OPTIONS`; a backend added from outside carries its :class:`Options` as its
``options`` attribute and :func:`testbed.nodes.register` puts it here. Each declares the
JSON schema of its keys (``topologies/schema.json`` is generated from it) and whether its
workers may sit in a multi-host topology.
"""

from __future__ import annotations

import re
from typing import Any

from testbed.common.errors import TopologyError

DEFAULT_IMAGE = "testbed/worker:cpu"
DEFAULT_SHM = "1g"  # Docker's 64 MB /dev/shm crashes NCCL (ncclShmOpen)
SIZE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?[bkmg]?$", re.IGNORECASE)
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_.-]{1,128})?(@sha256:[0-9a-f]{64})?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_VCPUS, DEFAULT_MEMORY = 1, "2g"
ACCELS = ("auto", "kvm", "tcg")
MEM_RE = re.compile(r"^([1-9][0-9]*)([mg])$", re.IGNORECASE)
_SIZE_SCHEMA = {"anyOf": [{"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?[bBkKmMgG]?$"},
                          {"type": "integer", "minimum": 0}]}
PCI_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class Options:
    """A backend that takes no keys of its own (``netns``)."""

    name: str = "netns"
    keys: tuple[str, ...] = ()
    """Topology keys this backend takes on a worker (and under ``defaults:``)."""
    schema: dict[str, dict] = {}
    """The JSON schema of each of :attr:`keys`."""
    multi_host = True
    """Whether its workers may be part of a topology with ``hosts:``."""

    def validate(self, options: dict[str, Any], path: str) -> tuple[tuple[str, Any], ...]:
        """Check this backend's keys of one worker; return them normalised and hashable."""
        if options:
            key = next(iter(options))
            raise TopologyError(f"{path}.{key}", f"'{key}' does not apply to backend {self.name}",
                                "remove it, or choose the backend that takes it")
        return ()

    def export(self, options: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
        """The topology-file form of validated options (``validate(export(o)) == o``)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in options}


def _size(value: Any, path: str) -> str:
    v = str(value)
    if isinstance(value, bool) or not SIZE_RE.fullmatch(v):
        raise TopologyError(path, f"invalid size {value!r}", "write bytes or a number with k, m or g, e.g. 2g")
    return v


def mem_mb(memory: str) -> int:
    m = MEM_RE.fullmatch(memory)
    assert m, memory
    return int(m.group(1)) * (1024 if m.group(2).lower() == "g" else 1)


class DockerOptions(Options):
    name = "docker"
    keys = ("image", "cpus", "memory", "shm_size", "env", "volumes")
    schema = {
        "image": {"type": "string", "maxLength": 255, "pattern": IMAGE_RE.pattern,
                  "description": f"image (default {DEFAULT_IMAGE}, built by `testbed image build`)"},
        "cpus": {"type": "number", "exclusiveMinimum": 0, "maximum": 1024, "description": "CPU limit"},
        "memory": {**_SIZE_SCHEMA, "description": "memory limit (bytes, or a number with k, m or g)"},
        "shm_size": {**_SIZE_SCHEMA, "description": f"/dev/shm size (default {DEFAULT_SHM}, enough for NCCL)"},
        "env": {"anyOf": [{"type": "object", "propertyNames": {"pattern": ENV_NAME_RE.pattern},
                           "additionalProperties": {"type": ["string", "number"]}},
                          {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*=.*$"}}],
                "description": "environment, {NAME: value} or [NAME=value, ...]"},
        "volumes": {"type": "array", "items": {"type": "string", "pattern": "^/[^:]*:/[^:]*(:(ro|rw))?$"},
                    "description": "HOST:CONTAINER[:ro|rw] bind mounts, both absolute"},
    }

    def validate(self, options: dict[str, Any], path: str) -> tuple[tuple[str, Any], ...]:
        out: dict[str, Any] = {}
        image = options.get("image", DEFAULT_IMAGE)
        if not isinstance(image, str) or not IMAGE_RE.fullmatch(image) or len(image) > 255:
            raise TopologyError(f"{path}.image", f"invalid image reference {image!r}",
                                f"e.g. image: {DEFAULT_IMAGE} (see `testbed image build`)")
        out["image"] = image
        if "cpus" in options:
            cpus = options["cpus"]
            if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not 0 < cpus <= 1024:
                raise TopologyError(f"{path}.cpus", f"cpus must be a number of CPUs > 0, got {cpus!r}", "e.g. cpus: 2")
            out["cpus"] = float(cpus)
        if "memory" in options:
            out["memory"] = _size(options["memory"], f"{path}.memory")
        out["shm_size"] = _size(options.get("shm_size", DEFAULT_SHM), f"{path}.shm_size")
        env = options.get("env", {})
        if isinstance(env, dict):
            items = list(env.items())
        elif isinstance(env, list) and all(isinstance(x, str) and "=" in x for x in env):
            items = [tuple(x.split("=", 1)) for x in env]
        else:
            raise TopologyError(f"{path}.env", f"env must map names to values, got {env!r}", "e.g. env: {FOO: bar}")
        pairs = []
        for k, v in items:
            if not isinstance(k, str) or not ENV_NAME_RE.fullmatch(k):
                raise TopologyError(f"{path}.env", f"invalid variable name {k!r}", "letters, digits and _")
            if isinstance(v, bool) or not isinstance(v, (str, int, float)) or "\0" in str(v):
                raise TopologyError(f"{path}.env.{k}", f"invalid value {v!r}", "give a string or a number")
            pairs.append(f"{k}={v}")
        out["env"] = tuple(pairs)
        vols = options.get("volumes", [])
        if not isinstance(vols, list):
            raise TopologyError(f"{path}.volumes", f"volumes must be a list, got {vols!r}", "e.g. - /data:/data:ro")
        checked = []
        for i, v in enumerate(vols):
            parts = v.split(":") if isinstance(v, str) else []
            if not 2 <= len(parts) <= 3 or not all(p.startswith("/") for p in parts[:2]) or \
                    (len(parts) == 3 and parts[2] not in ("ro", "rw")):
                raise TopologyError(f"{path}.volumes[{i}]", f"invalid volume {v!r}",
                                    "write HOST_PATH:CONTAINER_PATH[:ro|rw], both absolute")
            checked.append(v)
        out["volumes"] = tuple(checked)
        return tuple(out.items())


class VmOptions(Options):
    name = "vm"
    keys = ("vcpus", "memory", "accel", "gpu_pci", "kernel")
    schema = {
        "vcpus": {"type": "integer", "minimum": 1, "maximum": 64, "description": f"virtual CPUs (default {DEFAULT_VCPUS})"},
        "memory": {"type": "string", "pattern": "^[1-9][0-9]*[mMgG]$",
                   "description": f"the guest's memory, NNNm or NNNg, at least 256m (default {DEFAULT_MEMORY})"},
        "accel": {"enum": list(ACCELS), "description": "accelerator (default auto)"},
        "gpu_pci": {"type": "string", "pattern": "^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]$",
                    "description": "host PCI address bound to vfio-pci, passed through (untested)"},
        "kernel": {"type": "string", "pattern": "^/",
                   "description": "absolute directory of an unpacked kernel package (vmlinuz, lib/modules/)"},
    }
    multi_host = False  # the guest's MTU and files are the controller's

    def validate(self, options: dict[str, Any], path: str) -> tuple[tuple[str, Any], ...]:
        out: dict[str, Any] = {}
        v = options.get("vcpus", DEFAULT_VCPUS)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 64:
            raise TopologyError(f"{path}.vcpus", f"vcpus must be a whole number 1-64, got {v!r}", "e.g. vcpus: 2")
        out["vcpus"] = v
        m = options.get("memory", DEFAULT_MEMORY)
        if not isinstance(m, str) or not MEM_RE.fullmatch(m) or not 256 <= mem_mb(m) <= 1 << 20:
            raise TopologyError(f"{path}.memory", f"memory must be megabytes or gigabytes, at least 256m, got {m!r}",
                                "e.g. memory: 2g")
        out["memory"] = m.lower()
        a = options.get("accel", "auto")
        if a not in ACCELS:
            raise TopologyError(f"{path}.accel", f"unknown accel {a!r}", f"choose one of: {', '.join(ACCELS)}")
        out["accel"] = a
        if "gpu_pci" in options:
            g = options["gpu_pci"]
            if not isinstance(g, str) or not PCI_RE.fullmatch(g.lower()):
                raise TopologyError(f"{path}.gpu_pci", f"invalid PCI address {g!r}",
                                    "write DOMAIN:BUS:SLOT.FUNCTION as lspci -D shows it, e.g. 0000:65:00.0")
            out["gpu_pci"] = g.lower()
        if "kernel" in options:
            k = options["kernel"]
            if not isinstance(k, str) or not k.startswith("/") or "\0" in k or ".." in k.split("/"):
                raise TopologyError(f"{path}.kernel", f"kernel must be an absolute directory path, got {k!r}",
                                    "an unpacked kernel package: DIR/vmlinuz and DIR/lib/modules/<version>/")
            out["kernel"] = k
        for k in options:
            if k not in self.keys:
                raise TopologyError(f"{path}.{k}", f"'{k}' does not apply to backend vm",
                                    f"backend vm takes: {', '.join(self.keys)}")
        return tuple(out.items())


OPTIONS: dict[str, Options] = {o.name: o for o in (Options(), DockerOptions(), VmOptions())}
"""Backend name -> its topology keys. The registry of backends (:data:`testbed.nodes.BACKENDS`)
holds the same names; a test checks that they agree."""


def register_options(options: Options) -> None:
    """Make ``backend: NAME`` and its keys known to the loader (and to the generated schema)."""
    if not options.name or set(options.keys) != set(options.schema):
        raise ValueError(f"backend {options.name!r}: a name, and a schema for exactly its keys {options.keys}")
    OPTIONS[options.name] = options
