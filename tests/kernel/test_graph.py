"""`testbed graph` in a real headless browser (Debian's chromium): the page of three_switch
loads without a console message, draws every node and link with its shape, and served live
(`--serve`) its drawn utilisation follows an iperf3 flow across the bottleneck while a link
the flow does not cross stays idle; the secret URL is the only way in."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml

from tests.helpers import iperf3, three_switch
from tests.kernel.conftest import cli, cli_json

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium): the page is "
                                "checked in a real browser")


def _browse(url: str, tmp_path, budget_ms: int = 2500) -> tuple[str, str]:
    """(the DOM after the page's script ran for ``budget_ms`` of virtual time, chromium's log)."""
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'chromium'}", "--enable-logging=stderr", "--v=0",
                        f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, r.stderr


def _console(log: str) -> list[str]:
    """What the page said on its console (its errors included), as chromium logs it."""
    return [line for line in log.splitlines() if ":CONSOLE(" in line or "Uncaught" in line]


def _utilisation(dom: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'id="util-(\d+-\w+)" data-utilisation="([0-9.]+)"', dom)}


def test_the_page_draws_every_node_and_link_and_live_follows_a_flow(tmp_path, clean_kernel):
    doc = three_switch("gr3")
    for link in doc["links"]:
        if link.get("bottleneck"):
            link["rate"] = "100mbit"
    topo = tmp_path / "gr3.yaml"
    topo.write_text(yaml.safe_dump(doc))
    page = tmp_path / "out" / "gr3.html"
    static = cli_json("graph", str(topo), "--out", str(page))
    dom, log = _browse(page.as_uri(), tmp_path)
    assert _console(log) == [], _console(log)
    assert sorted(re.findall(r'id="node-(\w+)"', dom)) == sorted(doc["nodes"])
    drawn = dict(re.findall(r'<g class="link[^"]*" id="link-(\d+)" data-name="([\w-]+)"', dom))
    assert sorted(drawn.values()) == sorted(lk["name"] for lk in static["links"]) and len(drawn) == 10
    shapes = re.findall(r'class="shape">([^<]*)<', dom)  # each link's shape, drawn
    assert sorted(shapes) == ["100mbit"] * 2 + ["10gbit"] * 8, shapes

    cli_json("up", str(topo))
    server = subprocess.Popen([sys.executable, "-m", "testbed.cli", "graph", "-t", "gr3", "--serve", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        text = ""
        while not text.endswith("}\n"):  # the --json object, printed before the serving starts
            line = server.stdout.readline()
            assert line, server.stderr.read()
            text += line
        url = json.loads(text)["url"]
        secret = url.rstrip("/").rsplit("/", 1)[1]
        with pytest.raises(urllib.error.HTTPError, match="404"):  # without the secret, nothing
            urllib.request.urlopen(url.replace(secret, "x" * len(secret)) + "state.json", timeout=5)
        from testbed import Testbed

        tb = Testbed.attach("gr3")
        flow = threading.Thread(target=iperf3, args=(tb, 12), kwargs={"server": "w4", "client": "w0"})
        flow.start()
        try:
            time.sleep(4)  # the flow at its rate, and a second of it sampled
            dom, log = _browse(url, tmp_path)
        finally:
            flow.join()
        # a run on it: the page shows its iteration and accuracy (from the run's own exporter)
        runs = tmp_path / "runs"
        train = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "allreduce", "-t", "gr3", "--out",
                                  str(runs), "--max-iters", "100000", "--eval-every", "2", "--json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while not list(runs.glob("*/eval.jsonl")) or not list(runs.glob("*/eval.jsonl"))[0].read_text():
                assert time.monotonic() < deadline and train.poll() is None, train.communicate()
                time.sleep(0.5)
            time.sleep(1.5)  # its exporter has read the evaluation
            during, _ = _browse(url, tmp_path)
        finally:
            train.send_signal(signal.SIGINT)  # Ctrl-C: the run stops and leaves the testbed up
            train.communicate(timeout=60)
    finally:
        server.terminate()
        server.wait(timeout=10)
        cli("down", "gr3")
    assert _console(log) == [], _console(log)
    util = _utilisation(dom)
    index = {name: i for i, name in drawn.items()}
    up = util[f"{index['s1-s0']}-forward"]  # w0 -> w4 enters the core from s1 ...
    down = util[f"{index['s2-s0']}-reverse"]  # ... and leaves it towards s2
    assert 0.7 <= up <= 1.05 and 0.7 <= down <= 1.05, util
    assert util[f"{index['w7-s2']}-forward"] < 0.05 and util[f"{index['w7-s2']}-reverse"] < 0.05, util
    assert re.search(r'<span id="status">live, [^<]+</span>', dom) and '<span id="run">no run</span>' in dom, dom[-600:]
    assert server.returncode is not None
    run = re.search(r'<span id="run">run (\S+): allreduce, iteration (\d+), accuracy ([0-9.]+)</span>', during)
    assert run and int(run.group(2)) >= 2 and 0 < float(run.group(3)) <= 1, during[-600:]
