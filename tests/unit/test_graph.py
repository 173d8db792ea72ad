"""`testbed graph`'s model and page without a browser (tests/kernel/test_graph.py loads them
in chromium): every bundled topology gets a place for every node, none shared; the page is
one file whose embedded model no name can break out of; bad input is one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed import load_topology
from testbed.runs import graph

TOPOLOGIES = sorted((Path(__file__).resolve().parents[2] / "testbed" / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_every_node_of_every_bundled_topology_has_a_place_of_its_own(path):
    topo = load_topology(path)
    m = graph.model(topo)
    places = [(round(n["x"]), round(n["y"])) for n in m["nodes"]]
    assert len(places) == len(set(places)) == len(topo.nodes)
    assert all(x >= 0 and y >= 0 for x, y in places)
    assert [(l["a"], l["b"]) for l in m["links"]] == [tuple(l.endpoints) for l in topo.links]
    assert all(set(l["forward"]) == {"rate", "rate_bps", "delay", "loss"} for l in m["links"])


def test_the_page_is_one_file_and_its_model_cannot_close_its_script():
    m = graph.model(load_topology(TOPOLOGIES[0]))
    m["name"] = "x</script><script>alert(1)</script>&"
    page = graph.page(m)
    assert page.count("</script>") == 2 and "alert(1)</script>" not in page
    assert not re.search(r'(src|href)="https?:', page)  # nothing fetched from elsewhere
    embedded = re.search(r'<script id="model" type="application/json">(.*?)</script>', page, re.S).group(1)
    assert json.loads(embedded)["name"] == m["name"]
    assert 'data-live="false"' in page and 'data-live="true"' in graph.page(m, live=True)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, timeout=60)


def test_bad_input_is_one_line(tmp_path):
    lonely = tmp_path / "lonely.yaml"
    lonely.write_text(yaml.safe_dump({"name": "lonely", "nodes": {"w0": {"kind": "worker"}}, "links": []}))
    r = _cli("graph", str(lonely), "--out", str(tmp_path / "out" / "x.html"))
    assert r.returncode == 1 and r.stderr.startswith("error: nodes.w0: worker 'w0' has 0 links"), r.stderr
    assert len(r.stderr.splitlines()) == 2 and "Traceback" not in r.stderr  # the loader's line and its hint
    assert not (tmp_path / "out").exists()
    r = _cli("graph", str(TOPOLOGIES[0]), "--serve")
    assert r.returncode == 1 and "give a topology FILE, or -t for a running testbed, not both" in r.stderr, r.stderr
    r = _cli("graph", str(TOPOLOGIES[0]), "--out", str(tmp_path / "page.html"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["page"] == str(tmp_path / "page.html")
    assert (tmp_path / "page.html").read_text().startswith("<!DOCTYPE html>")


def test_which_graph_commands_enter_an_ordinary_users_namespaces():
    """A running testbed's graph reads the user's state (in their namespaces); a topology
    FILE's needs none, whatever the options' values look like."""
    from testbed.cli import _parsed

    def _needs_namespaces(argv):
        return (p := _parsed(argv)) is not None and p.namespaces

    assert not _needs_namespaces(["graph", "t.yaml"]) and not _needs_namespaces(["graph", "--out", "p.json", "t"])
    assert _needs_namespaces(["graph", "--out", "page.json"])  # before: taken for a FILE
    assert _needs_namespaces(["graph", "-t", "x.yaml"]) and _needs_namespaces(["graph", "t.yaml", "--serve"])
    assert not _needs_namespaces(["graph", "--help"])


def test_an_out_that_is_a_folder_is_one_line(tmp_path):
    for out in (".", str(tmp_path), f"{tmp_path}/sub/.."):
        r = _cli("graph", str(TOPOLOGIES[0]), "--out", out)
        assert r.returncode == 1 and r.stderr.startswith(f"error: --out {out}: a file name, not a folder"), r.stderr
