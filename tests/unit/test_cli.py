"""CLI behaviour that needs no running testbed: help everywhere, dry runs, clean errors.

The grammar (naming the testbed, choices, --json errors, --version) is tested in
test_cli_grammar.py."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from testbed.cli import app, main

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def _commands(cmd=None, path=()):
    """Every visible command and group of the app, as its argv path."""
    cmd = cmd or typer.main.get_command(app)
    yield list(path)
    for name, sub in getattr(cmd, "commands", {}).items():
        if not sub.hidden:
            yield from _commands(sub, (*path, name))


COMMANDS = list(_commands())


def test_every_command_group_is_there():
    names = {" ".join(c) for c in COMMANDS}
    assert {"up", "validate", "down", "status", "exec", "run", "sweep", "report", "doctor", "version", "link",
            "link show", "link set", "link replay", "monitor", "monitor up", "monitor down", "monitor status",
            "image", "image build"} <= names, names
    assert "_host" not in names  # hidden: the controller's requests over SSH


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "testbed")
def test_help_everywhere(cmd, capsys):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--help"])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    got = capsys.readouterr()
    assert e.value.code == 0, got.err
    assert got.out.startswith(f"Usage: testbed {' '.join(cmd)}".rstrip()), got.out[:200]
    assert not re.search(r"<[a-z][^>]*>", got.out), got.out  # readable metavars (FILE, RATE), not <list[Path]>


def test_help_as_a_program():
    r = cli("--help")
    assert r.returncode == 0 and "Usage: testbed" in r.stdout
    r = cli()  # no command: the help, as a usage error
    assert r.returncode == 2 and "Commands:" in r.stdout + r.stderr


def test_tables_piped_to_a_file_are_not_cut_at_80_columns():
    """Rich takes 80 columns when stdout is no terminal and cuts a report's cells to
    ``pactr…``; piped, the CLI prints wide, unless COLUMNS says otherwise."""
    code = ("from rich.table import Table; from testbed.cli import render; "
            "t = Table(*(f'column{i}' for i in range(8))); t.add_row(*['1,234,567,890'] * 8); render.out.print(t)")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "…" not in r.stdout and r.stdout.count("1,234,567,890") == 8, r.stdout
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, "COLUMNS": "60"})
    assert max(len(line) for line in r.stdout.splitlines()) <= 60, r.stdout


def _renamed(tmp_path, shipped: str, name: str) -> Path:
    """A shipped topology under a name no other test uses (names are global: namespaces)."""
    d = yaml.safe_load((ROOT / "topologies" / f"{shipped}.yaml").read_text())
    d["name"] = name
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_dry_run_prints_the_plan_and_creates_nothing(tmp_path):
    env = {"TESTBED_STATE_DIR": str(tmp_path / "state")}
    r = cli("up", str(_renamed(tmp_path, "three_switch", "clidry3")), "--dry-run", "--json", env=env)
    if os.geteuid() != 0:  # the dry run makes every check up makes, root first
        assert r.returncode == 1 and "needs root" in json.loads(r.stdout)["error"]
        return
    assert r.returncode == 0, r.stdout + r.stderr
    plan = json.loads(r.stdout)
    kinds = [a["action"] for a in plan["actions"]]
    assert kinds.count("CreateNetns") == 9 and kinds.count("CreateBridge") == 3
    assert kinds.count("CreateVeth") == 10 and kinds.count("ShapeEgress") == 20
    r = cli("up", str(_renamed(tmp_path, "dumbbell", "clidryd")), "--dry-run", env=env)
    assert r.returncode == 0 and "tc htb on l2a: 100mbit" in r.stdout
    assert not (tmp_path / "state" / "clidryd").exists()
    assert not [n for n in os.listdir("/run/netns") if n.startswith("clidry")] if Path("/run/netns").is_dir() else True


def test_bad_topology_is_one_clean_error(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("name: t\nnodes: {w0: {kind: worker}, w1: {kind: worker}}\nlinks:\n  - endpoints: [w0, w2]\n")
    for cmd in (("up", str(p), "--dry-run"), ("validate", str(p))):
        r = cli(*cmd)
        assert r.returncode == 1
        assert "links[0].endpoints[1]: node 'w2' is not defined" in r.stderr and "Traceback" not in r.stderr
        r = cli(*cmd, "--json")
        assert r.returncode == 1 and json.loads(r.stdout)["error"].startswith("links[0].endpoints[1]")


@pytest.mark.parametrize("text, words", [
    # a "billion laughs": 389 bytes that expand to 43 M values (2.1 GB and a 351 MB error before)
    ("name: [" + ", ".join(f"&a{i} [" + ", ".join([f"*a{i - 1}" if i else '"lol"'] * 9) + "]" for i in range(8))
     + "]\nnodes: {}\nlinks: []\n", "more than 1,000,000 values once its YAML aliases are expanded"),
    ("name: t\nnodes: " + "[" * 500 + "]" * 500 + "\nlinks: []\n", "nests too deeply"),
    ("name: t\nnodes: {w0: {kind: worker, gpu: " + "9" * 4301 + "}}\nlinks: []\n",
     "an integer of 4301 digits (at most 100)"),
    ("name: t\nnodes: {w0: {kind: worker}, w1: {kind: worker}}\nlinks:\n  - {endpoints: [w0, w1], rate: "
     + "1" * 310 + "bit}\n", "outside the supported range"),
    ("name: t\nnodes: {w0: {kind: worker}, w1: {kind: worker}}\nlinks:\n  - {endpoints: [w0, w1], rate: "
     "\uff11\uff10\uff10mbit}\n", "is not a rate"),
    ("name: t\nnodes: {w0: {kind: worker}, w1: {kind: worker}}\nlinks:\n  - {endpoints: [w0, w1], "
     "name: \"\\e[2J\\e[31mLINK\\nfake: line\"}\n", "invalid link name '\\x1b[2J"),
])
def test_hostile_topologies_are_one_bounded_clean_error(tmp_path, text, words):
    p = tmp_path / "t.yaml"
    p.write_text(text)
    r = cli("validate", str(p))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert words in r.stderr and len(r.stderr) < 20_000 and "\x1b" not in r.stderr, r.stderr[-2000:]


def test_sweep_repeats_are_bounded_before_anything_is_made():
    r = cli("sweep", "-t", "nosuch", "--max-iters", "1", "--repeats", "1000000")
    assert r.returncode == 2 and "--repeats" in r.stdout + r.stderr and "Traceback" not in r.stderr


def test_usage_errors_exit_2():
    assert cli("up").returncode == 2
    assert cli("frobnicate").returncode == 2
    assert cli("link", "set", "--frobnicate").returncode == 2
    assert cli("report").returncode == 2  # DIR... is required


def test_a_run_or_sweep_refused_after_the_out_check_leaves_no_out_directory(tmp_path):
    """`--out` is made to check that it takes files; a run or sweep refused later (here: two
    rates for the bottleneck, a testbed that is not up) removes it again, and only what it
    made: a directory that was there, or one holding files, stays."""
    from testbed.runs.checks import check_out, discard_out

    trace = tmp_path / "t.csv"
    trace.write_text("0,100mbit\n")
    r = cli("run", "allreduce", "--bw", "100mbit", "--bw-trace", str(trace), "--out", str(tmp_path / "a" / "b"))
    assert r.returncode != 0 and "--bw and --bw-trace" in r.stderr, r.stderr
    r = cli("sweep", "--schemes", "allreduce", "--bw", "100mbit", "-t", "nosuchtestbed", "--out",
            str(tmp_path / "c" / "d"))
    assert r.returncode != 0 and "nosuchtestbed" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
    made = check_out(tmp_path / "e" / "f")
    assert made == tmp_path / "e"
    (tmp_path / "e" / "keep").write_text("")
    discard_out(tmp_path / "e" / "f", made)
    assert sorted(p.name for p in (tmp_path / "e").iterdir()) == ["keep"]
    assert check_out(tmp_path) is None


def test_the_run_header_says_when_max_iters_ends_the_run_before_its_epochs(capsys):
    from testbed.cli.runs import _announce
    from testbed.runs.spec import WorkloadSpec

    w = WorkloadSpec.parse("pactrain", ["--epochs", "15", "--batch-size", "32", "--max-iters", "5"])
    _announce("pactrain", w, "100mbit", "three_switch (default)")
    assert "15 epochs (at most 5 iterations), batch 32/worker" in capsys.readouterr().err
    _announce("pactrain", w.replace(max_iters=None), "100mbit", "three_switch (default)")
    assert "15 epochs, batch 32/worker" in capsys.readouterr().err


def test_os_errors_from_hostile_paths_are_one_clean_error(tmp_path):
    """A path component past the file system's 255 bytes: `error: File name too long: ...`,
    exit 1, no traceback (before: OSError tracebacks from run --out and a long state dir)."""
    r = cli("run", "allreduce", "--out", str(tmp_path / ("a" * 300)), "--max-iters", "1")
    assert r.returncode == 1 and "File name too long" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = cli("status", env={"TESTBED_STATE_DIR": str(tmp_path / ("b" * 300))})
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr


def test_a_closed_stdout_ends_the_command_quietly():
    """`testbed ... | head` or a parent that died: writing fails with EPIPE, in a command's
    output (click ends it with 1) or in its error's JSON (141, as if killed by SIGPIPE),
    never with a traceback."""
    import os
    import subprocess
    import sys

    for argv, code in ((["--help"], 1), (["validate", "/nonexistent/t.yaml", "--json"], 141)):
        r, w = os.pipe()
        os.close(r)  # nobody will ever read what it writes
        try:
            p = subprocess.run([sys.executable, "-m", "testbed", *argv], stdout=w, stderr=subprocess.PIPE,
                               text=True, timeout=60)
        finally:
            os.close(w)
        assert p.returncode == code and "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, \
            (argv, p.returncode, p.stderr)
