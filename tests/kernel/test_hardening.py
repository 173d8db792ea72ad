"""Hardening, as an adversary would try it: output that is not markup, no code from the
working directory, names that are not paths (issue: hardening a root tool)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import dumbbell
from tests.kernel.conftest import cli, pids_of_this_session, run

pytestmark = pytest.mark.kernel
TESTBED = str(Path(sys.executable).parent / "testbed")  # the console script a user runs


def test_link_names_are_printed_literally_never_as_markup(clean_kernel, tmp_path):
    d = dumbbell("mk")
    d["links"][0]["name"] = "[/x]"
    d["links"][1]["name"] = "[bold]y[/bold]"
    topo = tmp_path / "mk.yaml"
    topo.write_text(yaml.safe_dump(d))
    wide = {"COLUMNS": "250"}  # no cell wrapped across lines
    r = cli("up", str(topo), "--no-exporter", env=wide)
    try:
        assert r.returncode == 0, r.stderr
        assert "[/x]" in r.stdout and "[bold]y[/bold]" in r.stdout
        for argv in (("status", "mk"), ("link", "show"), ("link", "set", "[/x]", "--bw", "1gbit")):
            r = cli(*argv, env=wide)
            assert r.returncode == 0 and "Traceback" not in r.stderr, (argv, r.stderr)
            assert "[/x]" in r.stdout, (argv, r.stdout)
    finally:
        assert cli("down", "mk").returncode == 0


def test_no_code_from_the_working_directory_runs_as_root(clean_kernel, tmp_path):
    """A directory holding look-alike packages of every module testbed starts as a child."""
    marker = tmp_path / "PWNED"
    for pkg, mods in (("collectors", ("__init__", "__main__")), ("testbed", ("__init__", "nsexec", "cli")),
                      ("workloads", ("__init__", "train", "pretrain"))):
        (tmp_path / pkg).mkdir()
        for m in mods:
            (tmp_path / pkg / f"{m}.py").write_text(f"open({str(marker)!r}, 'a').write('{pkg}.{m}\\n')\n")
    topo = tmp_path / "cw.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("cw")))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        r = run([TESTBED, "up", str(topo)], cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        target = Path(os.environ["TESTBED_STATE_DIR"]) / "targets" / "testbed-cw.json"
        assert target.exists(), "the real link exporter announced itself"
        r = run([TESTBED, "exec", "w0", "--", "true"], cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        r = run([TESTBED, "run", "allreduce", "-t", "cw", "--out", str(tmp_path / "runs"), "--max-iters", "2",
                 "--eval-every", "2", "--no-exporter"], cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
    finally:
        run([TESTBED, "down", "cw"], cwd=tmp_path, env=env)
    assert not marker.exists(), marker.read_text()


@pytest.mark.parametrize("name", ["../../etc", "tb\n", "targets", "a/b", "-x"])
def test_names_on_the_command_line_are_validated_like_names_in_yaml(clean_kernel, name):
    for argv in (("down", name), ("status", name), ("link", "show", "-t", name)):
        r = cli(*argv)
        assert r.returncode != 0 and "Traceback" not in r.stderr, (argv, r.stderr)
        assert "testbed name" in r.stderr or "No such option" in r.stderr or "Usage" in r.stderr, (argv, r.stderr)


def test_first_run_after_a_non_editable_install_from_another_directory(clean_kernel, tmp_path):
    """`pip install .` (a copy, not a link to the checkout), then the quick start's
    `testbed run pactrain --bw 100mbit` from an unrelated directory (kept tiny)."""
    root = Path(__file__).resolve().parents[2]
    site = tmp_path / "site"
    r = run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(root)],
            cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (site / "testbed" / "topologies" / "three_switch.yaml").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = run([sys.executable, "-c", "import testbed, workloads, collectors; print(testbed.__file__)"],
            cwd=elsewhere, env=env)
    assert r.stdout.startswith(str(site)), r.stdout + r.stderr
    r = run([sys.executable, "-m", "testbed.cli", "run", "pactrain", "--bw", "100mbit", "--max-iters", "3",
             "--eval-every", "3", "--no-exporter", "--json"], cwd=elsewhere, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    assert (elsewhere / "runs").is_dir()
    # the copy names the commit it was built from (setup.py), not "unknown" (no git there)
    head = run(["git", "-C", str(root), "rev-parse", "HEAD"]).stdout.strip()
    assert (site / "testbed" / "COMMIT").read_text().strip() == head
    assert json.loads(r.stdout)["code_version"] == head[:7]


def _rates(ns: str, dev: str) -> list[str]:
    out = run(["tc", "-n", ns, "class", "show", "dev", dev]).stdout.split()
    return [out[i + 1] for i, w in enumerate(out) if w == "rate"]


def test_cli_values_pass_the_loaders_rules_and_a_half_failed_link_set_is_undone(clean_kernel, tmp_path):
    topo = tmp_path / "val.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("val", rate="100mbit")))
    assert cli("up", str(topo), "--no-exporter").returncode == 0
    try:
        for argv, words in ((("link", "set", "s0-s1", "--limit", "10000001"), "--limit"),
                            (("link", "set", "s0-s1", "--bw", "fast"), "--bw"),
                            (("run", "allreduce", "-t", "val", "--timeout", "nan"), "--timeout"),
                            (("run", "allreduce", "-t", "val", "--timeout", "0"), "--timeout"),
                            (("sweep", "-t", "val", "--timeout", "-1"), "--timeout")):
            r = cli(*argv, "--json")
            assert r.returncode == 1 and "Traceback" not in r.stderr, (argv, r.stderr)
            assert words in r.stdout, (argv, r.stdout)  # one JSON object naming the flag
        # the testbed is still fully usable: nothing bad reached the state file
        for argv in (("status", "val"), ("link", "show"), ("exec", "w0", "--", "true")):
            assert cli(*argv).returncode == 0, argv
        assert _rates("val", "l2a") == ["100Mbit"]
        # one direction changes, the other fails (its HTB tree is gone): the first is put back
        assert run(["tc", "-n", "val", "qdisc", "del", "dev", "l2b", "root"]).returncode == 0
        r = cli("link", "set", "s0-s1", "--bw", "50mbit")
        assert r.returncode == 1 and "restored" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert _rates("val", "l2a") == ["100Mbit"]
        assert "100mbit" in cli("link", "show", "--json").stdout
    finally:
        assert cli("down", "val").returncode == 0


def test_runs_under_faults_unwritable_out_and_a_second_run_on_a_busy_testbed(clean_kernel, tmp_path):
    topo = tmp_path / "flt.yaml"
    topo.write_text(yaml.safe_dump(dumbbell("flt", rate="1gbit")))
    ro = tmp_path / "ro"
    ro.mkdir()
    run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)])
    try:
        r = cli("run", "allreduce", "--topology", str(topo), "--out", str(ro / "runs"), "--json")
        assert r.returncode == 1 and "--out" in r.stdout and "Traceback" not in r.stderr, r.stdout + r.stderr
    finally:
        run(["umount", str(ro)])
    assert run(["ip", "netns", "list"]).stdout.find("flt") < 0, "nothing was built"
    assert cli("up", str(topo), "--no-exporter").returncode == 0
    try:
        import subprocess

        first = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "allreduce", "-t", "flt", "--out",
                                  str(tmp_path / "runs"), "--max-iters", "100000", "--no-exporter"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        import time

        deadline = time.monotonic() + 60
        while not list((tmp_path / "runs").glob("*/rank0.log")) and time.monotonic() < deadline:
            time.sleep(0.2)
        r = cli("run", "allreduce", "-t", "flt", "--out", str(tmp_path / "runs2"), "--json")
        assert r.returncode == 1 and "busy with another run" in r.stdout, r.stdout + r.stderr
        # Ctrl-C twice in quick succession: the cleanup still finishes
        first.send_signal(2)
        time.sleep(0.05)
        first.send_signal(2)
        err = first.communicate(timeout=60)[1]
        # (the second signal may land after the cleanup, while the process exits: -2)
        assert first.returncode in (1, -2) and "interrupted" in err and "Traceback" not in err, err
        assert pids_of_this_session("workloads.train") == [], "ranks left running"
    finally:
        assert cli("down", "flt").returncode == 0


def test_down_all_removes_exactly_what_this_state_directory_owns(clean_kernel, tmp_path):
    other = {"TESTBED_STATE_DIR": str(tmp_path / "other-state")}
    a, b = tmp_path / "oa.yaml", tmp_path / "ob.yaml"
    a.write_text(yaml.safe_dump(dumbbell("oa")))
    b.write_text(yaml.safe_dump(dumbbell("ob")))
    assert run(["ip", "netns", "add", "foreign1"]).returncode == 0
    try:
        assert cli("up", str(a)).returncode == 0               # ours, with its exporter
        assert cli("up", str(b), env=other).returncode == 0    # another state directory's
        state = Path(os.environ["TESTBED_STATE_DIR"])
        import shutil

        shutil.rmtree(state / "oa")  # our ledger is lost: tags and the target file remain
        r = cli("down", "--all", "--json")
        assert r.returncode == 0, r.stderr
        assert '"oa"' in r.stdout and "ob" not in r.stdout
        left = run(["ip", "netns", "list"]).stdout
        assert "oa" not in left.split() and "ob" in left.split() and "foreign1" in left
        assert not (state / "targets" / "testbed-oa.json").exists()
        assert (tmp_path / "other-state" / "targets" / "testbed-ob.json").exists(), "the other exporter runs on"
    finally:
        cli("down", "--all", env=other)
        run(["ip", "netns", "del", "foreign1"])


def test_a_damaged_state_file_is_one_clean_error_and_down_still_works(clean_kernel, tmp_path):
    """state.json is untrusted input: a key missing, a value of the wrong type, an egress map
    that misses a link, a bad subnet, nesting past the parser, a non-mapping. `status`,
    `status NAME` and `link show` say it is damaged (or list it), never a traceback; `down`
    reads the ledger and removes everything."""
    import json

    p = tmp_path / "dmg.yaml"
    p.write_text(yaml.safe_dump(dumbbell("dmg")))
    assert cli("up", str(p), "--no-exporter").returncode == 0
    path = Path(os.environ["TESTBED_STATE_DIR"]) / "dmg" / "state.json"
    good = json.loads(path.read_text())
    damaged = [{k: v for k, v in good.items() if k != key} for key in ("subnet", "egress", "nodes", "name")]
    damaged += [{**good, "name": 5}, {**good, "source": 5}, {**good, "nodes": []}, {**good, "egress": {}},
                {**good, "subnet": "x"}, {**good, "created": {"a": 1}}, {**good, "topology": "x"}]
    texts = [json.dumps(d) for d in damaged] + ["[" * 100_000 + "]" * 100_000, "1" * 5000, "[1, 2]", "{garbage"]
    for text in texts:
        path.write_text(text)
        for cmd in (("status",), ("status", "dmg"), ("link", "show", "-t", "dmg")):
            r = cli(*cmd)
            assert r.returncode in (0, 1) and "Traceback" not in r.stderr, (text[:80], cmd, r.stderr[-1500:])
            if cmd != ("status",) and text not in (json.dumps(damaged[5]), json.dumps(damaged[9])):
                assert r.returncode == 1 and "damaged" in r.stderr, (text[:80], cmd, r.stderr[-500:])
    r = cli("down", "dmg")
    assert r.returncode == 0 and "removed: dmg" in r.stdout, r.stderr
