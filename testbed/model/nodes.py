"""``nodes:``: workers (each runs one rank, on a backend) and switches (L2 bridges)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.common.errors import TopologyError, shown
from testbed.model.backend_options import OPTIONS
from testbed.model.defaults import Defaults, check_backend, option_keys
from testbed.model.fields import MAX_NODE_NAME, check_name, mapping, unknown_keys
from testbed.model.hosts import LOCAL_HOST
from testbed.model.sysctls import parse_sysctls

NODE_KINDS = ("worker", "switch")
NODE_KEYS = {"worker": ("kind", "backend", "gpu", "sysctls", "host"), "switch": ("kind", "stp", "host")}
"""Keys each kind takes; a worker takes its backend's own keys too (:mod:`testbed.model.backend_options`)."""
MAX_GPU = 1024
"""A worker's gpu: a device index below this (a host has far fewer; a 31-digit one passed)."""


@dataclass(frozen=True)
class Node:
    """A worker (runs one rank) or a switch (an L2 bridge)."""

    name: str
    kind: str
    backend: str | None = None
    gpu: int | None = None
    stp: bool = False
    sysctls: tuple[tuple[str, str], ...] = ()
    """Network sysctls set inside the worker's namespace after it is created (key, value)."""
    options: tuple[tuple[str, Any], ...] = ()
    """The backend's own keys (e.g. docker's image, cpus), validated by that backend."""
    host: str = LOCAL_HOST
    """The machine the node is placed on (a ``hosts:`` entry, or the local host)."""

    @property
    def is_worker(self) -> bool:
        return self.kind == "worker"

    def to_dict(self) -> dict:
        """The node's entry under ``nodes:`` (without its name, the entry's key)."""
        d: dict[str, Any] = {"kind": self.kind}
        if self.is_worker:
            d["backend"] = self.backend
            if self.gpu is not None:
                d["gpu"] = self.gpu
            if self.sysctls:
                d["sysctls"] = dict(self.sysctls)
            if self.options:
                assert self.backend is not None  # a worker always has one (_worker)
                d.update(OPTIONS[self.backend].export(self.options))
        elif self.stp:
            d["stp"] = True
        if self.host != LOCAL_HOST:
            d["host"] = self.host
        return d


def parse_nodes(value: Any, defaults: Defaults, host_names: set[str]) -> list[Node]:
    """``nodes:`` in file order, at least one of them a worker. A worker without ``host:``
    has host None here: it is placed once the links are known (:mod:`testbed.model.graph`)."""
    nodes_in = mapping(value, "nodes", "node name -> node")
    if not nodes_in:
        raise TopologyError("nodes", "no nodes", "define at least two workers and the switches between them")
    nodes = [_node(name, spec, defaults, host_names) for name, spec in nodes_in.items()]
    if not any(n.is_worker for n in nodes):
        raise TopologyError("nodes", "no workers", "add nodes with kind: worker")
    return nodes


def _node(name: str, spec: Any, defaults: Defaults, host_names: set[str]) -> Node:
    path = f"nodes.{name}"
    check_name(name, path, MAX_NODE_NAME, "node name")
    spec = mapping(spec if spec is not None else {}, path, "kind: worker|switch")
    kind = spec.get("kind")
    if kind not in NODE_KINDS:
        raise TopologyError(f"{path}.kind", f"unknown or missing kind {kind!r}",
                            f"choose one of: {', '.join(NODE_KINDS)}")
    if kind == "worker":
        unknown_keys(spec, NODE_KEYS[kind] + option_keys(), path)
        return _worker(name, spec, path, defaults, host_names)
    unknown_keys(spec, NODE_KEYS[kind], path)
    stp = spec.get("stp", False)
    if not isinstance(stp, bool):
        raise TopologyError(f"{path}.stp", f"stp must be true or false, got {stp!r}")
    return Node(name, "switch", stp=stp, host=_node_host(spec, path, host_names) or LOCAL_HOST)


def _worker(name: str, spec: dict, path: str, defaults: Defaults, host_names: set[str]) -> Node:
    backend = check_backend(spec.get("backend", defaults.backend), f"{path}.backend")
    options = _backend_options(spec, path, backend, defaults)
    gpu = spec.get("gpu")
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < MAX_GPU):
        raise TopologyError(f"{path}.gpu", f"gpu must be a device index in 0..{MAX_GPU - 1}, got {shown(gpu)}")
    sysctls = {**defaults.sysctls, **parse_sysctls(spec.get("sysctls"), f"{path}.sysctls")}
    return Node(name, "worker", backend=backend, gpu=gpu, sysctls=tuple(sysctls.items()), options=options,
                host=_node_host(spec, path, host_names))  # type: ignore[arg-type]  # None: placement decides


def _backend_options(spec: dict, path: str, backend: str, defaults: Defaults) -> tuple[tuple[str, Any], ...]:
    """The backend's own keys: defaults apply to the workers whose backend takes them; a
    node's own keys must fit its backend."""
    impl = OPTIONS[backend]
    opts = {k: v for k, v in defaults.options.items() if k in impl.keys}
    opts.update({k: spec[k] for k in option_keys() if k in spec})
    return impl.validate(opts, path)


def _node_host(spec: dict, path: str, host_names: set[str]) -> str | None:
    if "host" not in spec:
        return None  # placed later: a worker follows its switch
    h = spec["host"]
    if not isinstance(h, str) or h not in host_names:
        raise TopologyError(f"{path}.host", f"unknown host {h!r}",
                            f"define it under hosts:, or use one of: {', '.join(sorted(host_names))}")
    return h
