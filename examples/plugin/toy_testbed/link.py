"""``type: jumbo``: a veth pair with jumbo frames (``mtu:``, 1280-9000, default 9000).

Its ends are made by an action of its own (:class:`JumboVeth`), so that another host's
agent can make them only when it has this package too: a share names the action, and the
agent reads it back from the registry the package's import fills.
"""

from dataclasses import dataclass

from testbed.common.errors import TopologyError
from testbed.plan.actions import CreateVeth
from testbed.plan.base import register
from testbed.plan.links import LinkKind


@register
@dataclass(frozen=True)
class JumboVeth(CreateVeth):
    """A veth pair of a jumbo link."""

    def describe(self) -> str:
        return "jumbo " + super().describe()


class Jumbo(LinkKind):
    name = "jumbo"
    description = "a veth pair with jumbo frames (mtu: 1280-9000, default 9000)"
    keys = ("mtu",)
    schema = {"mtu": {"type": "integer", "minimum": 1280, "maximum": 9000}}

    def joins(self, host_a, host_b):
        return host_a == host_b

    def validate(self, options, path):
        mtu = options.get("mtu", 9000)
        if isinstance(mtu, bool) or not isinstance(mtu, int) or not 1280 <= mtu <= 9000:
            raise TopologyError(f"{path}.mtu", f"mtu must be 1280..9000, got {mtu!r}")
        return (("mtu", mtu),)

    def plan(self, ctx, link, a, b):
        return [(a.host, JumboVeth(a.ns, a.ifname, b.ns, b.ifname, master=a.master, peer_master=b.master,
                                   link=link.index, index=ctx.alloc(a.host, a.ns), mtu=dict(link.options)["mtu"]))]
