"""A new backend, link type or scheme is one new module plus one registration call.

Each toy below is written as a real module into a fresh directory (a package the testbed
has never seen), registered with one call, and then used through the public path only: a
topology that names it is loaded and planned (backend, link type), validates against the
schema generated from the loader's registries, and a scheme is resolved by name and its
hook runs on a one-rank gloo process group. Nothing of the testbed is patched, and no
module of the testbed or of the workloads names the toys. ``EXTENSIONS`` is the measured
list of what each touched; docs/architecture.md states it, and the last test keeps the two
equal.
"""

from __future__ import annotations

import importlib
import ipaddress
import re
import sys
import textwrap
from pathlib import Path

import pytest

from testbed import load_topology_dict
from testbed.common.errors import TopologyError
from testbed.engine.planner import make_plan
from testbed.model import backend_options, link_types, schema
from testbed.plan import links as plan_links

ROOT = Path(__file__).resolve().parents[2]
NET = ipaddress.ip_network("10.9.0.0/24")

BACKEND = '''
from testbed.common.errors import TopologyError
from testbed.model.backend_options import Options
from testbed.nodes.base import Check
from testbed.nodes.netns import NetnsBackend
from testbed.plan.actions import CreateNetns


class ToyOptions(Options):
    name = "toy"
    keys = ("flavour",)
    schema = {"flavour": {"enum": ["sweet", "sour"], "description": "how the toy tastes"}}

    def validate(self, options, path):
        flavour = options.get("flavour", "sweet")
        if flavour not in ("sweet", "sour"):
            raise TopologyError(f"{path}.flavour", f"unknown flavour {flavour!r}", "sweet or sour")
        return (("flavour", flavour),)


class ToyBackend(NetnsBackend):
    name = "toy"
    options = ToyOptions()

    def plan_node(self, testbed, node, ns, tag, address, sysctls):
        return [CreateNetns(ns, f"toy-{dict(node.options)['flavour']}:" + tag)]

    def checks(self):
        return [Check("toy engine", True, "a toy answers")]
'''

LINK = (ROOT / "examples" / "plugin" / "toy_testbed" / "link.py").read_text()
"""The toy link type is the example plugin's (examples/plugin): registered here by one call,
there by an entry point (tests/workloads/test_plugins.py)."""

SCHEME = '''
from dataclasses import dataclass

import torch.distributed as dist


@dataclass
class ToyState:
    process_group: object = None
    payload_bytes: int = 0
    calls: int = 0

    def take_payload_bytes(self):
        n, self.payload_bytes = self.payload_bytes, 0
        return n


def toy_hook(state, bucket):
    state.calls += 1
    buf = bucket.buffer()
    state.payload_bytes += buf.numel() * buf.element_size()
    group = state.process_group or dist.group.WORLD
    return dist.all_reduce(buf.div_(group.size()), group=group, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


def attach(ddp, opts, masks=None):
    state = ToyState(process_group=opts.process_group)
    ddp.register_comm_hook(state, toy_hook)
    return state
'''


def _register_backend() -> None:
    from testbed import nodes

    nodes.register("toyext.backend:ToyBackend")


def _register_link() -> None:
    from toyext.link import Jumbo  # type: ignore[import-not-found]

    plan_links.register_link_kind(Jumbo())


def _register_scheme() -> None:
    from workloads import schemes

    schemes.register(schemes.Scheme("toyscheme", "a toy hook: all-reduce of the mean", "toyext.scheme"))


EXTENSIONS = {
    "backend": ("toyext/backend.py", BACKEND, _register_backend, 'testbed.nodes.register("MODULE:CLASS")'),
    "link type": ("toyext/link.py", LINK, _register_link, "testbed.plan.links.register_link_kind(KIND())"),
    "scheme": ("toyext/scheme.py", SCHEME, _register_scheme,
               'workloads.schemes.register(Scheme(NAME, SUMMARY, "MODULE"))'),
}
"""Per extension kind: the one new module, its source, and the one registration call."""


@pytest.fixture
def install(tmp_path, monkeypatch):
    """Write an extension's module into a fresh package directory and make its one
    registration; every registry is restored afterwards. Returns the files it wrote."""
    from testbed import nodes
    from workloads import schemes

    monkeypatch.syspath_prepend(str(tmp_path))
    backends = getattr(nodes, "_REGISTERED", nodes.BACKENDS)  # where names are registered
    saved = [(r, dict(r)) for r in (backends, backend_options.OPTIONS, link_types.LINK_TYPES,
                                    plan_links.LINK_KINDS, schemes.SCHEMES)]

    def install(kind: str) -> list[str]:
        path, source, register, _ = EXTENSIONS[kind]
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        register()
        return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.py"))

    yield install
    for registry, before in saved:
        registry.clear()
        registry.update(before)
    made = getattr(nodes.BACKENDS, "_made", {})  # backends made on first use
    for name in set(made) - set(backends):
        del made[name]
    for name in [m for m in sys.modules if m == "toyext" or m.startswith("toyext.")]:
        del sys.modules[name]


def _topology(worker: dict | None = None, link: dict | None = None) -> dict:
    return {"name": "ext", "nodes": {"s0": {"kind": "switch"}, "w0": {"kind": "worker", **(worker or {})},
                                     "w1": {"kind": "worker"}},
            "links": [{"endpoints": ["w0", "s0"], **(link or {})}, {"endpoints": ["w1", "s0"]}]}


def _validates(data: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(schema.build()).validate(data)


def test_a_backend_is_one_module_plus_one_registration(install):
    from testbed import nodes
    from testbed.plan.actions import CreateNetns

    with pytest.raises(TopologyError):  # unknown before its registration
        load_topology_dict(_topology({"backend": "toy"}))
    assert install("backend") == ["toyext/backend.py"]
    data = _topology({"backend": "toy", "flavour": "sour"})
    _validates(data)
    t = load_topology_dict(data)
    assert t.node("w0").options == (("flavour", "sour"),)
    assert load_topology_dict(t.to_dict()) == t
    plan = make_plan(t, NET)
    toy_made = [a.ns for a in plan.actions if isinstance(a, CreateNetns) and a.tag.startswith("toy-sour:")]
    assert toy_made == [plan.nodes["w0"].netns]  # w0 made by the toy, w1 by netns
    with pytest.raises(TopologyError, match=r"nodes\.w0\.flavour: unknown flavour 'bitter'"):
        load_topology_dict(_topology({"backend": "toy", "flavour": "bitter"}))
    with pytest.raises(TopologyError, match=r"'flavour' does not apply to backend netns"):
        load_topology_dict(_topology({"flavour": "sour"}))
    assert "toy" in nodes.names() and [c.name for c in nodes.get("toy").checks()] == ["toy engine"]


def test_a_link_type_is_one_module_plus_one_registration(install):
    from testbed.plan.actions import CreateVeth

    with pytest.raises(TopologyError, match=r"links\[0\]\.type: unknown link type 'jumbo'"):
        load_topology_dict(_topology(link={"type": "jumbo"}))
    assert install("link type") == ["toyext/link.py"]
    data = _topology(link={"type": "jumbo", "mtu": 4000})
    _validates(data)
    t = load_topology_dict(data)
    assert [(l.type, l.options) for l in t.links] == [("jumbo", (("mtu", 4000),)), ("veth", ())]
    assert load_topology_dict(t.to_dict()) == t
    veths = [a for a in make_plan(t, NET).actions if isinstance(a, CreateVeth)]
    assert [(a.link, a.mtu) for a in veths] == [(0, 4000), (1, None)]
    with pytest.raises(TopologyError, match=r"links\[0\]\.mtu: mtu must be 1280\.\.9000"):
        load_topology_dict(_topology(link={"type": "jumbo", "mtu": 100}))
    with pytest.raises(TopologyError, match=r"links\[1\]\.mtu: 'mtu' does not apply to link type veth"):
        load_topology_dict({**_topology(), "links": [{"endpoints": ["w0", "s0"]},
                                                      {"endpoints": ["w1", "s0"], "type": "veth", "mtu": 9000}]})
    jsonschema = pytest.importorskip("jsonschema")
    with pytest.raises(jsonschema.ValidationError):  # its key needs its type, in the schema too
        _validates(_topology(link={"mtu": 4000}))


def test_a_scheme_is_one_module_plus_one_registration(install):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from workloads import schemes

    with pytest.raises(ValueError, match="unknown scheme 'toyscheme'"):
        schemes.get("toyscheme")
    assert install("scheme") == ["toyext/scheme.py"]
    scheme, values = schemes.parse_variant("toyscheme")
    assert scheme.name == "toyscheme" and values == {} and "toyscheme" in schemes.names()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        state = scheme.attach(model, schemes.options({}))
        model(torch.ones(3, 4)).sum().backward()
        assert state.calls >= 1 and state.take_payload_bytes() == (4 * 2 + 2) * 4
        assert model.module.weight.grad is not None
    finally:
        dist.destroy_process_group()


def test_no_module_of_the_testbed_or_the_workloads_names_a_toy():
    names = re.compile(r"toyext|toyscheme|\bjumbo\b|ToyBackend")
    sources = [p for d in ("testbed", "workloads") for p in (ROOT / d).rglob("*.py")]
    assert sources and not [p for p in sources if names.search(p.read_text())]


def test_the_architecture_page_states_the_measured_list():
    page = (ROOT / "docs" / "architecture.md").read_text()
    for kind, (path, _, _, call) in EXTENSIONS.items():
        assert f"| {kind} | one module (`{path.split('/')[-1]}` here) | `{call}` |" in page, kind
