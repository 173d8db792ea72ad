"""A testbed across two SSH hosts as an ordinary user (issue 42 item 3): the link between the
hosts is a user-space tunnel (:mod:`testbed.net.tunnel`) between the user's rootless
namespaces on each side, made, shaped, proven and removed without root anywhere.

The controller is this machine (its rootless namespaces); the other host is a real sshd in
its own network and mount namespaces (:mod:`tests.kernel.sshhosts`), reached as the user."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import ordinary_user, user_processes_left

pytestmark = pytest.mark.kernel
if shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists():
    pytest.skip("no sshd (apt-get install openssh-server): the multi-host tests need real SSH servers",
                allow_module_level=True)

USER = "tbsshuser"
TESTBED = str(Path(sys.executable).parent / "testbed")


def test_an_ordinary_user_runs_across_two_ssh_hosts_over_a_tunnel(clean_lab):
    lab = clean_lab
    d = Path(tempfile.mkdtemp(prefix="tbsshu-"))
    try:
        with ordinary_user(USER) as pw:
            subprocess.run(["usermod", "-p", "*", USER], check=True)  # useradd locks it: sshd (no PAM) refuses those
            home = Path(pw.pw_dir)
            ssh = home / ".ssh"
            ssh.mkdir(mode=0o700, exist_ok=True)
            shutil.copy(lab.key, ssh / "id_lab")
            shutil.copy(lab.known_hosts, ssh / "known_hosts_lab")
            subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(ssh)], check=True)
            (ssh / "id_lab").chmod(0o600)
            host = lab.hosts[0].spec(ssh / "id_lab", ssh / "known_hosts_lab", user=USER)
            topo = {"name": "mru", "hosts": [host],
                    "nodes": {"s0": {"kind": "switch"}, "s1": {"kind": "switch", "host": "h1"},
                              "w0": {"kind": "worker"}, "w1": {"kind": "worker"}},
                    "links": [{"endpoints": ["w0", "s1"]}, {"endpoints": ["w1", "s0"]},
                              {"endpoints": ["s0", "s1"], "rate": "100mbit", "bottleneck": True}]}
            d.chmod(0o755)
            (d / "mru.yaml").write_text(yaml.safe_dump(topo))
            (d / "mru.yaml").chmod(0o644)
            env = ["env", "-i", f"HOME={home}", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]

            def as_user(*args: str) -> subprocess.CompletedProcess:
                return subprocess.run(["runuser", "-u", USER, "--", *env, TESTBED, *args], capture_output=True,
                                      text=True, timeout=300, cwd=str(d))

            r = as_user("up", str(d / "mru.yaml"), "--json")
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            assert {l["name"]: l["type"] for l in json.loads(r.stdout)["links"]} == \
                {"w0-s1": "veth", "w1-s0": "veth", "s0-s1": "tunnel"}
            assert lab.leftovers() == {}  # root's view of h1: nothing; it is all in the user's namespaces there
            r = as_user("run", "allreduce", "-t", "mru", "--compute-time", "0.05", "--max-iters", "4",
                        "--out", str(home / "runs"))
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            run = next((home / "runs").glob("*/summary.json")).parent
            summary = json.loads((run / "summary.json").read_text())
            assert summary["status"] == "ok" and summary["proof"] == "passed", summary
            links = {l["name"]: l.get("type") for l in json.loads((run / "topology.json").read_text())["links"]}
            assert links["s0-s1"] == "tunnel"
            assert (run / "rank0.jsonl").stat().st_size > 0  # rank 0 (w0) ran on h1, its records copied back
            r = as_user("down", "mru")
            assert r.returncode == 0, r.stdout + r.stderr
            assert user_processes_left(USER) == []  # no holder, forwarder or agent of the user on either host
    finally:
        shutil.rmtree(d, ignore_errors=True)
