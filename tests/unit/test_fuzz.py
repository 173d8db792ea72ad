"""Property: any malformed topology gives a TestbedError, never another exception."""

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.common.errors import TestbedError
from testbed.model.topology import load_topology_dict
from tests.helpers import dumbbell

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["100mbit", "1gbit", "5ms", "0.1%", "w0", "s1", "switch",
                                                           "worker", "10.1.0.0/24", "100mbps", ""]))
values = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                   st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), c,
                                                                   max_size=4)), max_leaves=12)
KEYS = ["name", "nodes", "links", "defaults", "subnet", "kind", "endpoints", "rate", "delay", "jitter", "loss",
        "limit", "forward", "reverse", "bottleneck", "backend", "gpu", "stp", "link", "bogus"]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_mutations_raise_only_testbed_errors(data):
    doc = copy.deepcopy(dumbbell())
    for _ in range(data.draw(st.integers(1, 4))):
        paths = list(_paths(doc))
        path = data.draw(st.sampled_from(paths))
        target = doc
        for p in path[:-1]:
            target = target[p]
        op = data.draw(st.sampled_from(["set", "delete", "add"]))
        if not path:
            doc = data.draw(values)
            break
        key = path[-1]
        if op == "set":
            target[key] = data.draw(values)
        elif op == "delete":
            del target[key]
        elif isinstance(target[key], dict):
            target[key][data.draw(st.sampled_from(KEYS))] = data.draw(values)
        elif isinstance(target[key], list):
            target[key].append(data.draw(values))
    try:
        load_topology_dict(doc)
    except TestbedError:
        pass


@settings(max_examples=300, deadline=None)
@given(doc=values)
def test_arbitrary_documents_raise_only_testbed_errors(doc):
    try:
        load_topology_dict(doc)
    except TestbedError:
        pass
