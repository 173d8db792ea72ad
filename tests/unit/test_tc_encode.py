"""tc requests encoded once per (command, kind, arguments) with the interface's index
written into a copy (:func:`testbed.net.tc.encode`) are byte for byte what pyroute2 encodes
for that index, for every request the build and a link change make."""

from __future__ import annotations

import pytest

from testbed.model.shapes import shape_from_dict
from testbed.net import tc, tcbatch

SHAPES = [{"rate": "100mbit"}, {"rate": "1gbit", "limit": 77}, {"rate": "37kbit", "delay": "5ms", "loss": "1%"},
          {"rate": "10gbit", "delay": "20ms", "jitter": "2ms"}]


def _build_requests(index: int, shape) -> list[tuple[str, str, dict]]:
    reqs = [("add", "htb", dict(index=index, handle=tc.ROOT, default=1)),
            ("add-class", "htb", dict(index=index, **tc._class_kwargs(shape)))]
    if shape.needs_netem:
        reqs.append(("add", "netem", dict(index=index, **tc._netem_kwargs(shape))))
    return reqs


@pytest.mark.parametrize("spec", SHAPES, ids=lambda d: "-".join(map(str, d.values())))
@pytest.mark.parametrize("index", [1, 7, 4096, 2**31 - 1])
def test_a_cached_encoding_is_pyroute2s_for_each_index(spec, index):
    shape = shape_from_dict(spec)
    changes = [r for kind in (None, "netem", "pfifo") for r in tcbatch.change_requests(index, shape, kind)[0]]
    for command, kind, kw in _build_requests(index, shape) + changes:
        assert tc.encode(command, kind, **kw) == tc.encode_uncached(command, kind, **kw), (command, kind)


def test_the_index_is_where_the_cache_writes_it():
    """Two indexes differ in those four bytes only (the field the cache rewrites)."""
    kw = tc._class_kwargs(shape_from_dict({"rate": "100mbit"}))
    a, b = (tc.encode_uncached("add-class", "htb", index=i, **kw) for i in (5, 0x01020304))
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    assert len(a) == len(b) and diff and min(diff) >= tc._INDEX_OFFSET and max(diff) < tc._INDEX_OFFSET + 4
