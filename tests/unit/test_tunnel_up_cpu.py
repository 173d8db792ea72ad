"""benchmarks.tunnel_up's CPU column: the user's tunnel forwarders found by their argv, their
utime + stime read as benchmarks.tunnel reads them, counted once however often seen."""

from __future__ import annotations

import subprocess
import sys

from benchmarks import tunnel_up


def test_a_forwarder_is_found_by_its_module_and_its_cpu_read():
    spin = ("import time\nwhile time.process_time() < 0.3: pass\nprint('spun', flush=True)\n"
            "time.sleep(30)")  # 0.3 s of CPU however busy the machine is
    proc = subprocess.Popen([sys.executable, "-c", spin, "testbed.net.tunnel"],  # argv holds the module's name
                            stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "testbed.net.tunnelx"])
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "spun\n"
        got = tunnel_up.forwarders_here()
        [key] = [k for k in got if k.startswith(f"{proc.pid}:")]
        assert not any(k.startswith(f"{other.pid}:") for k in got)
        assert 0.25 <= got[key] < 30  # in clock ticks: a little under what process_time counted
    finally:
        for p in (proc, other):
            p.kill()
            p.wait()


def test_cpu_used_counts_each_forwarder_seen_at_both_samples_once():
    before = {"10:5": 1.0, "11:7": 2.0, "12:9": 0.5}  # 12 ended before the second sample
    after = {"10:5": 1.5, "11:7": 2.25, "13:1": 4.0}  # 13 started after the first
    assert tunnel_up.cpu_used(before, after) == 0.75
