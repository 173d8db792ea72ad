"""Batched, pre-encoded shape changes leave the kernel exactly as pyroute2's request path
does with the same requests."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from testbed import Testbed, load_topology_dict
from testbed.common.errors import KernelError
from testbed.net.rtnl import Rtnl
from testbed.net.tcbatch import LinkChanger, change_requests
from testbed.model.units import Rate
from tests.helpers import dumbbell
from tests.kernel.conftest import run

pytestmark = [pytest.mark.kernel]


def _tc_view(ns: str, dev: str) -> str:
    """Class and qdisc details, with the device name and counters taken out."""
    text = ""
    for what in ("class", "qdisc"):
        text += run(["tc", "-n", ns, "-d", what, "show", "dev", dev]).stdout
    return re.sub(r"\bdirect_packets_stat \d+", "", re.sub(r"\bdev \S+", "dev X", text))


def test_batched_changes_equal_tc_change_and_refusals_are_named(clean_kernel):
    with Testbed.up(load_topology_dict(dumbbell("tcb", rate="100mbit"))) as tb:
        link = tb.find_links("s0-s1")[0]
        fwd, rev = tb.egress[(link.index, "forward")], tb.egress[(link.index, "reverse")]
        changer = LinkChanger()
        try:
            base = link.shape("forward")
            # rate only (no child), then a queue limit (a pfifo child appears), then the rate
            # again with the pfifo kept. The reference sends the same requests through
            # pyroute2's own path (IPRoute.tc), one call each.
            kind = None
            for shape in (replace(base, rate=Rate.parse("37mbit")), replace(base, rate=Rate.parse("2gbit"), limit=500),
                          replace(base, rate=Rate.parse("3mbit"), limit=500)):
                changer.apply([(fwd, shape, "test")])
                with Rtnl.open(rev.ns) as rt:
                    reqs, kind = change_requests(rt.index(rev.ifname), shape, kind)
                    for command, k, kw in reqs:
                        rt.ipr.tc(command, k, **kw)
                assert _tc_view(fwd.ns, fwd.ifname) == _tc_view(rev.ns, rev.ifname), shape
            assert "rate 3Mbit" in _tc_view(fwd.ns, fwd.ifname) and "pfifo" in _tc_view(fwd.ns, fwd.ifname)
            # a refusal names the interface and what was being done; the other requests applied
            assert run(["tc", "-n", rev.ns, "qdisc", "del", "dev", rev.ifname, "root"]).returncode == 0
            with pytest.raises(KernelError, match=rf"{rev.ifname}.*No such file"):
                changer.apply([(fwd, replace(base, rate=Rate.parse("5mbit")), "fwd"),
                               (rev, replace(base, rate=Rate.parse("5mbit")), "rev")])
            assert "rate 5Mbit" in _tc_view(fwd.ns, fwd.ifname)
        finally:
            changer.close()


def test_one_call_changing_more_interfaces_of_a_namespace_than_acknowledgements_fit(clean_kernel):
    """300 egress changes in one namespace in one call (a switch namespace's links in one trace
    step): more than the 256 acknowledgements the kernel's default receive buffer holds for
    one datagram, so they go in several; every class gets its new rate."""
    from testbed.model.shapes import shape_from_dict
    from testbed.net import tc
    from testbed.plan.plan import Endpoint

    ns, n = "tbcbig", 150
    run(["ip", "netns", "add", ns])
    changer = LinkChanger()
    try:
        run(["ip", "-n", ns, "-batch", "-"], check=True,
            input="".join(f"link add a{i} type veth peer name b{i}\n" for i in range(n)))
        eps = [Endpoint(ns, f"{side}{i}") for i in range(n) for side in "ab"]
        with Rtnl.open(ns) as rt:
            rt.load_indexes()
            for ep in eps:
                tc.apply(rt, ep.ifname, shape_from_dict({"rate": "100mbit"}))
        changer.apply([(ep, shape_from_dict({"rate": "37mbit"}), ep.ifname) for ep in eps])
        classes = run(["tc", "-n", ns, "-batch", "-"],
                      input="".join(f"class show dev {ep.ifname}\n" for ep in eps)).stdout.splitlines()
        assert len(classes) == 2 * n and all("rate 37Mbit" in c for c in classes), classes[:3]
    finally:
        changer.close()
        run(["ip", "netns", "del", ns])
