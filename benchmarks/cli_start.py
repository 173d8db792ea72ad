"""How long the `testbed` command takes to start, and to bring a testbed up and down.

Times whole commands, process start included, as a user types them: `testbed --version`,
`--help`, `status`, `up FILE` and `down NAME` of a copy of topologies/three_switch.yaml
(renamed, so that it does not clash with a testbed someone else has up), and a rank's
start inside a node (`python -m testbed.nodes.nsexec NETNS -- /bin/true`, what `testbed
run` starts for each rank). Next to them, the library's own `Testbed.up` / `down` of the
same topology in one process (imports done, no exporter), as benchmarks/up_down.py times it.

``--tree DIR`` (repeatable) times another checkout of testbed as well, e.g. an older
commit unpacked with `git archive COMMIT | tar -x -C DIR`: its packages go first on
PYTHONPATH, with this venv. The trees take turns in every repetition, so that both see
the same load on a shared machine; the table gives the median of ``--runs`` and the
spread (min-max). `up`/`down` need root; without it only the first three rows are timed.
It uses its own state directory unless TESTBED_STATE_DIR is set.

``--record DIR`` writes every measurement of every tree (row name, repeat, seconds, the
tree's commit: ``--tree-commit``, one per ``--tree`` in the same order, since an unpacked
archive knows none), issue 44's targets and what each tree's ``import testbed.cli`` and
``import testbed.nodes.nsexec`` import to DIR/result.json for ``benchmarks.archive``
(docs/results/cli.md's table: ``benchmarks.cli_tables``).

    sudo flock /tmp/kernel.lock python -m benchmarks.cli_start [--runs 10] [--tree /tmp/base]
        [--tree-commit 7b2c8b8] [--record DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.archive import record
from testbed.runs.rundir import code_version

ROOT = Path(__file__).resolve().parents[1]
ELSEWHERE = tempfile.gettempdir()
"""Where the timed processes run: not this checkout (`python -m`/`-c` put the current
directory first on sys.path, ahead of a --tree)."""
TARGETS_S = {"--version": 0.2, "--help": 0.2, "status": 0.3, "up": 0.3, "down": 0.3}
"""Issue 44's targets for the commands as typed (three_switch's up and down), in seconds."""
IMPORT_CHECKS = ("testbed.cli", "testbed.nodes.nsexec")
HEAVY = ("pyroute2", "docker", "torch", "matplotlib", "numpy", "yaml", "prometheus_client", "paramiko")
LIBRARY = """
import json, sys, time
from testbed import Testbed, load_topology
from testbed.engine.core import down
topo = load_topology(sys.argv[1])
t = time.perf_counter(); tb = Testbed.up(topo); u = time.perf_counter() - t
t = time.perf_counter(); down(tb.name); d = time.perf_counter() - t
print(json.dumps([u, d]))
"""


def _env(tree: str | None) -> dict:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _timed(argv: list[str], env: dict) -> float:
    t = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ELSEWHERE)
    took = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return took


def imported(tree: str | None, module: str) -> list[str]:
    """The heavy packages ``import MODULE`` imports."""
    code = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], env=_env(tree), capture_output=True, text=True, check=True,
                       cwd=ELSEWHERE)
    return r.stdout.split()


def one_round(tree: str | None, topo: Path, name: str, kernel: bool) -> dict[str, float]:
    env = _env(tree)
    exe = str(Path(sys.executable).parent / "testbed")
    t = {"--version": _timed([exe, "--version"], env), "--help": _timed([exe, "--help"], env),
         "status": _timed([exe, "status"], env)}
    if not kernel:
        return t
    t["up"] = _timed([exe, "up", str(topo)], env)
    try:
        st = json.loads(subprocess.run([exe, "status", name, "--json"], env=env, capture_output=True, text=True,
                                       check=True, cwd=ELSEWHERE).stdout)
        ns = next(n["netns"] for n in st["nodes"] if n["kind"] == "worker")
        t["rank start"] = _timed([sys.executable, "-m", "testbed.nodes.nsexec", ns, "--", "/bin/true"], env)
    finally:
        t["down"] = _timed([exe, "down", name], env)
    r = subprocess.run([sys.executable, "-c", LIBRARY, str(topo)], env=env, capture_output=True, text=True,
                       cwd=ELSEWHERE)
    if r.returncode:
        raise RuntimeError(f"library up/down: {r.stderr.strip()[-500:]}")
    t["library up"], t["library down"] = json.loads(r.stdout.strip().splitlines()[-1])
    return t


def this_commit() -> dict:
    """This checkout's commit (HEAD) and the files its working tree has changed or added
    since (relative paths), which a record names beside the commit."""
    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
        return r.stdout if r.returncode == 0 else ""
    changed = sorted(line[3:] for line in git("status", "--porcelain").splitlines() if len(line) > 3)
    return {"commit": code_version(), "uncommitted": changed}


def trees_of(trees: list, commits: list[str], recording: bool) -> list[dict]:
    """The trees timed, as records name them: index 0 this checkout, then each --tree with
    its --tree-commit. A record must name every tree's commit: a one-line exit otherwise."""
    if len(commits) != len(trees) and (commits or recording):
        raise SystemExit(f"--tree-commit: one per --tree, in the same order ({len(trees)} trees, "
                         f"{len(commits)} commits): a record names the commit each tree was unpacked from")
    return [{"tree": 0, **this_commit()}, *({"tree": i + 1, "commit": c} for i, c in enumerate(commits))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--tree", action="append", default=[], help="another checkout to time alongside (repeatable)")
    p.add_argument("--tree-commit", action="append", default=[], metavar="COMMIT",
                   help="the commit of each --tree, in the same order (needed with --record)")
    p.add_argument("--topology", type=Path, default=ROOT / "topologies" / "three_switch.yaml")
    p.add_argument("--name", default="clistart", help="the name the copy of the topology gets")
    p.add_argument("--record", type=Path, metavar="DIR", help="write every measurement to DIR/result.json")
    args = p.parse_args()
    if args.runs < 1:
        raise SystemExit("--runs: at least 1")
    named = trees_of(args.tree, args.tree_commit, bool(args.record))
    kernel = os.geteuid() == 0
    os.environ.setdefault("TESTBED_STATE_DIR", tempfile.mkdtemp(prefix="cli_start."))
    work = Path(tempfile.mkdtemp(prefix="cli_start_topo."))
    topo = work / f"{args.name}.yaml"
    topo.write_text(re.sub(r"(?m)^name: .*$", f"name: {args.name}", args.topology.read_text(), count=1))
    trees: list[str | None] = [None, *args.tree]
    label = {None: "this tree", **{t: t for t in args.tree}}
    times: dict[str | None, dict[str, list[float]]] = {t: {} for t in trees}
    try:
        for _ in range(args.runs):
            for tree in trees:
                for k, v in one_round(tree, topo, args.name, kernel).items():
                    times[tree].setdefault(k, []).append(v)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"median of {args.runs} runs, ms (min-max); {os.cpu_count()} CPUs; "
          f"{'as root' if kernel else 'not root: no up/down'}")
    print(f"{'':14}" + "".join(f"{label[t][-28:]:>30}" for t in trees))
    for row in times[None]:
        cells = []
        for t in trees:
            vs = times[t][row]
            cells.append(f"{statistics.median(vs) * 1e3:7.0f} ({min(vs) * 1e3:.0f}-{max(vs) * 1e3:.0f})")
        print(f"{row:14}" + "".join(f"{c:>30}" for c in cells))
    imports = {m: [imported(t, m) for t in trees] for m in IMPORT_CHECKS}
    for module, per_tree in imports.items():
        print(f"import {module}: " + "; ".join(f"{label[t]}: {' '.join(got) or '(none of them)'}"
                                              for t, got in zip(trees, per_tree)) + f"  (of {', '.join(HEAVY)})")
    if args.record:
        rows = [{"tree": i, "commit": named[i]["commit"], "row": row, "repeat": k, "s": v}
                for i, t in enumerate(trees) for row, vs in times[t].items() for k, v in enumerate(vs)]
        print("recorded:", record(args.record, "cli_start", rows, runs=args.runs, cpus=os.cpu_count(), root=kernel,
                                  topology=args.topology.stem, trees=named, targets_s=TARGETS_S, heavy=list(HEAVY),
                                  imports=imports))


if __name__ == "__main__":
    main()
