"""The README's quick start as a new user runs it, timed: this checkout's committed tree in a
fresh folder in an ordinary user's home, then the README's one command, by that user.

    sudo python -m benchmarks.quick_start --user NAME [--record DIR] [--keep]

NAME is an existing ordinary user (made with ``useradd -m NAME``; no sudo, no capabilities).
The command is read from README.md's "Quick start" block, so the benchmark runs what a
newcomer reads; it is split at ``&& .venv/bin/testbed`` to time the install and the run apart,
each in a login shell of NAME (``runuser -l``: the user's own environment). The tree is
``git archive HEAD`` (what a clone would get), unpacked by the user. On a machine whose pip
takes torch from a local folder (``PIP_FIND_LINKS``), that setting is passed on, with
``PIP_RETRIES=0`` so that an extra index that does not resolve is given up at once.

``--record DIR`` writes DIR/result/result.json (``quick_start``: the install's and the run's seconds,
the venv's size, torch's version, the commit, and how long after it the user had no process left) and copies the run's directory to DIR/run/, for
``python -m benchmarks.archive DIR/result DIR/run --name NAME`` (docs/results/network.md's
quick start, ``benchmarks.ops_tables``). The folder in NAME's home is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.archive import record
from testbed.runs.rundir import code_version

ROOT = Path(__file__).resolve().parents[1]
RUN_AT = " && .venv/bin/testbed "


def readme_command(readme: Path = ROOT / "README.md") -> str:
    """The quick start's console command, its continuation lines joined."""
    text = readme.read_text()
    m = re.search(r"^## Quick start\n.*?^```console\n(?P<cmd>.*?)^```", text, re.M | re.S)
    if not m:
        raise SystemExit("README.md: no ```console block under '## Quick start'")
    cmd = re.sub(r"\\\n\s*", "", m["cmd"]).strip()
    if not cmd.startswith("$ ") or RUN_AT not in cmd or "\n" in cmd:
        raise SystemExit(f"README.md: the quick start is not one '$ ...{RUN_AT}...' command: {cmd!r}")
    return cmd[2:]


def as_user(user: str, folder: Path, cmd: str, env: dict[str, str]) -> float:
    """Seconds ``cmd`` took in ``folder`` in a login shell of ``user``; exits on failure."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    script = f"cd {shlex.quote(str(folder))} && {'export ' + exports + ' && ' if exports else ''}{cmd}"
    t0 = time.monotonic()
    r = subprocess.run(["runuser", "-l", user, "-c", script], capture_output=True, text=True)
    took = time.monotonic() - t0
    if r.returncode:
        raise SystemExit(f"as {user}: {cmd[:60]}... exited {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}")
    return took


def fresh_tree(user: str) -> Path:
    """This checkout's HEAD, unpacked by ``user`` into a new folder of their home."""
    pw = pwd.getpwnam(user)
    folder = Path(subprocess.run(["runuser", "-u", user, "--", "mktemp", "-d", f"{pw.pw_dir}/quickstart.XXXXXX"],
                                 check=True, capture_output=True, text=True).stdout.strip())
    tree = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["runuser", "-u", user, "--", "tar", "-x", "-C", str(folder)], input=tree, check=True)
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--user", required=True, help="an ordinary user (useradd -m NAME)")
    ap.add_argument("--record", type=Path, metavar="DIR", help="write DIR/result/result.json and DIR/run/")
    ap.add_argument("--keep", action="store_true", help="leave the folder in the user's home")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (it runs the command as --user with runuser)")
    try:
        pw = pwd.getpwnam(args.user)
    except KeyError:
        sys.exit(f"--user {args.user}: no such user; make one with: useradd -m {args.user}")
    if pw.pw_uid < 1000:
        sys.exit(f"--user {args.user}: uid {pw.pw_uid} is a system account; give an ordinary user")
    install, run = readme_command().split(RUN_AT, 1)
    env = {"PIP_FIND_LINKS": os.environ["PIP_FIND_LINKS"], "PIP_RETRIES": "0"} if "PIP_FIND_LINKS" in os.environ else {}
    folder = fresh_tree(args.user)
    commit = code_version()  # the tree git archive gave the user
    try:
        install_s = as_user(args.user, folder, install, env)
        run_s = as_user(args.user, folder, ".venv/bin/testbed " + run, env)
        row = measured(folder, install_s, run_s, commit, env)
        row["user_processes_gone_s"] = gone_after(args.user)  # the rootless holder stops after the last testbed
        print(f"install {install_s:.1f} s, venv {row['venv_bytes'] / 1e9:.2f} GB, torch {row['torch']}; "
              f"run {run_s:.1f} s ({row['run_id']})")
        if args.record:
            print(f"recorded: {record(args.record / 'result', 'quick_start', [row])}")
            shutil.copytree(folder / "runs" / row["run_id"], args.record / "run", symlinks=True)
    finally:
        if not args.keep:
            shutil.rmtree(folder)
    return 0


def gone_after(user: str, limit_s: float = 10.0) -> float | None:
    """Seconds until ``user`` had no process left (looked at every 0.1 s), None after ``limit_s``."""
    t0 = time.monotonic()
    while (waited := time.monotonic() - t0) < limit_s:
        if not subprocess.run(["pgrep", "-u", user], capture_output=True, text=True).stdout.split():
            return round(waited, 1)
        time.sleep(0.1)
    return None


def measured(folder: Path, install_s: float, run_s: float, commit: str, env: dict[str, str]) -> dict:
    runs = sorted((p for p in (folder / "runs").iterdir() if (p / "summary.json").is_file()),
                  key=lambda p: p.stat().st_mtime)
    venv = folder / ".venv"
    size = sum(p.lstat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink())
    torch = next((p.name[len("torch-"):-len(".dist-info")] for p in venv.glob("lib/python*/site-packages/torch-*.dist-info")), "?")
    return {"install_s": round(install_s, 2), "run_s": round(run_s, 2), "venv_bytes": size, "torch": torch,
            "run_id": runs[-1].name, "tree": commit, "env": sorted(env)}


if __name__ == "__main__":
    sys.exit(main())
