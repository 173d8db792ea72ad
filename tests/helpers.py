"""Topology builders shared by tests and benchmarks."""

from __future__ import annotations


def star(n: int, name: str = "star", rate: str = "1gbit", prefix: str = "w") -> dict:
    nodes = {"s0": {"kind": "switch"}}
    nodes.update({f"{prefix}{i}": {"kind": "worker"} for i in range(n)})
    return {"name": name, "defaults": {"link": {"rate": rate}}, "nodes": nodes,
            "links": [{"endpoints": [f"{prefix}{i}", "s0"]} for i in range(n)]}


def dumbbell(name: str = "db", rate: str = "100mbit", **shape) -> dict:
    return {"name": name, "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch"},
                                    "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s0"]}, {"endpoints": ["w1", "s1"]},
                      {"endpoints": ["s0", "s1"], "rate": rate, "bottleneck": True, **shape}]}
