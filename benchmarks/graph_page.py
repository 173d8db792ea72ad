"""The screenshot of `testbed graph --serve` in the docs (docs/img/graph.png), taken for real.

    sudo python -m benchmarks.graph_page [--out docs/img/graph.png]

Brings up three_switch (named ``grshot``) with its two uplinks at 100 Mbit/s, serves its
live page, starts one iperf3 flow w0 -> w4 (it crosses both uplinks), and after 4 s has
Debian's headless chromium load the page for 2.5 s of its virtual time and take the
screenshot; then takes everything down. One run; the utilisation drawn is that second's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, check=True,
                          timeout=300, **kw)


def shoot(out: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium: apt-get install chromium")
    doc = yaml.safe_load((ROOT / "testbed" / "topologies" / "three_switch.yaml").read_text())
    doc["name"] = "grshot"
    for link in doc["links"]:
        if link.get("bottleneck"):
            link["rate"] = "100mbit"
    with tempfile.TemporaryDirectory() as tmp:
        topo = Path(tmp) / "grshot.yaml"
        topo.write_text(yaml.safe_dump(doc))
        _cli("up", str(topo))
        server = flow_s = None
        try:
            server = subprocess.Popen([sys.executable, "-m", "testbed.cli", "graph", "-t", "grshot", "--serve"],
                                      stdout=subprocess.PIPE, text=True)
            url = server.stdout.readline().split(": ", 1)[1].split()[0]
            nodes = {n["name"]: n for n in json.loads(_cli("status", "grshot", "--json").stdout)["nodes"]}
            flow_s = subprocess.Popen([sys.executable, "-m", "testbed.cli", "exec", "-t", "grshot", "w4", "--",
                                       "iperf3", "-s", "-1"], stdout=subprocess.DEVNULL)
            time.sleep(1.5)
            flow = subprocess.Popen([sys.executable, "-m", "testbed.cli", "exec", "-t", "grshot", "w0", "--",
                                     "iperf3", "-c", nodes["w4"]["address"], "-t", "10"], stdout=subprocess.DEVNULL)
            time.sleep(4)
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--user-data-dir={tmp}/chromium", f"--screenshot={out.resolve()}",
                            "--window-size=1100,640", "--virtual-time-budget=2500", url],
                           capture_output=True, timeout=120, check=True)
            flow.wait(timeout=30)
        finally:
            for p in (server, flow_s):
                if p is not None and p.poll() is None:
                    p.terminate()
                    p.wait(timeout=10)
            _cli("down", "grshot")
    print(f"{out}: three_switch at 100mbit uplinks, one iperf3 flow w0 -> w4")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "graph.png")
    shoot(p.parse_args().out)


if __name__ == "__main__":
    main()
