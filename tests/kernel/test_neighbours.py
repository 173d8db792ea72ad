"""Many workers on one host (issue 45): the kernel's neighbour (ARP) table is one for every
network namespace and holds 1024 dynamic entries by default (gc_thresh3), so a full mesh
of more than 32 workers overflowed it and gloo's connects failed with "No route to host".
Workers get deterministic MACs and permanent entries for each other."""

from __future__ import annotations

import concurrent.futures

import pytest
import yaml

from tests.kernel.conftest import cli, cli_json, run
from testbed.plan.naming import worker_mac

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
WORKERS = 40  # 40 x 39 = 1560 entries: more than the default table takes


def _topology(name: str) -> dict:
    nodes = {"s0": {"kind": "switch"}, "s1": {"kind": "switch"},
             **{f"w{i}": {"kind": "worker"} for i in range(WORKERS)}}
    links = ([{"endpoints": [f"w{i}", f"s{i % 2}"]} for i in range(WORKERS)]
             + [{"endpoints": ["s0", "s1"], "rate": "1gbit", "bottleneck": True}])
    return {"name": name, "nodes": nodes, "links": links}


def _addresses(name: str) -> dict[int, str]:
    out = {}
    for i in range(WORKERS):
        line = run(["ip", "-n", f"{name}.w{i}", "-4", "-o", "addr", "show", "dev", "eth0"]).stdout
        out[i] = line.split()[3].split("/")[0]
    return out


def test_forty_workers_reach_each_other_at_once_through_permanent_neighbour_entries(tmp_path, clean_kernel):
    topo = tmp_path / "nb40.yaml"
    topo.write_text(yaml.safe_dump(_topology("nb40")))
    cli_json("up", str(topo))
    try:
        addr = _addresses("nb40")
        neigh = run(["ip", "-n", "nb40.w7", "neigh", "show", "dev", "eth0"]).stdout.splitlines()
        permanent = {w[0]: w[2] for w in map(str.split, neigh) if w[-1] == "PERMANENT"}
        macs = {i: run(["ip", "-n", f"nb40.w{i}", "-o", "link", "show", "dev", "eth0"]).stdout.split(
            "link/ether ")[1].split()[0] for i in range(WORKERS)}
        assert permanent == {addr[i]: macs[i] for i in range(WORKERS) if i != 7}
        assert set(macs.values()) == {worker_mac("nb40", rank) for rank in range(WORKERS)}  # the plan's, one each

        def connect_all(i: int) -> list[str]:
            # every worker reaches every other one at once, as gloo's full mesh does
            script = ("import socket,sys\nbad=[]\nfor a in sys.argv[1:]:\n"
                      " s=socket.socket(); s.settimeout(3)\n"
                      " try: s.connect((a, 9))\n"
                      " except ConnectionRefusedError: pass\n"
                      " except OSError as e: bad.append(f'{a}: {e}')\n"
                      " s.close()\nprint('\\n'.join(bad))")
            r = run(["ip", "netns", "exec", f"nb40.w{i}", "python3", "-c", script,
                     *(addr[j] for j in range(WORKERS) if j != i)])
            return [f"w{i} -> {x}" for x in r.stdout.split("\n") if x]

        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            failed = [x for xs in pool.map(connect_all, range(WORKERS)) for x in xs]
        assert failed == [], failed[:5]
    finally:
        cli("down", "nb40")


def test_more_entries_than_one_datagram_s_acknowledgements_fit_are_all_made(clean_kernel):
    """A worker of a 601-worker star gets 600 entries: more than the 256 acknowledgements the
    kernel's default receive buffer holds for one datagram (ENOBUFS beyond), so they go in
    several; every one of them is made, permanent."""
    from testbed.net import tcbatch
    from testbed.net.rtnl import Rtnl

    ns = "tbnbbatch"
    run(["ip", "netns", "add", ns])
    try:
        run(["ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"], check=True)
        run(["ip", "-n", ns, "link", "set", "d0", "up"])
        entries = [(f"10.9.{i // 250}.{i % 250 + 1}", worker_mac("nbbatch", i)) for i in range(600)]
        rtnl = Rtnl.open(ns)
        try:
            tcbatch.add_neighbours(rtnl, "d0", entries)
        finally:
            rtnl.close()
        lines = run(["ip", "-n", ns, "neigh", "show", "dev", "d0"]).stdout.splitlines()
        assert len(lines) == 600 and all(line.split()[-1] == "PERMANENT" for line in lines), lines[:3]
        assert {line.split()[0] for line in lines} == {a for a, _ in entries}
    finally:
        run(["ip", "netns", "del", ns])
