"""How long `testbed run` takes to refuse a run it cannot make, as a user types it.

Times the whole command, process start included, of `testbed run SCHEME ... --testbed NAME`
where no testbed NAME is up (the refusal every check that needs only the names can give at
once), for the digits set, for CIFAR-10 (a synthetic copy of the python release, made here:
six batches in the real layout) and for pactrain, which pre-trains (0.2 epochs) before the
run unless the refusal comes first. Nothing touches the kernel: the state directory is a
temporary one, and the refusal comes before anything is built.

``--tree DIR`` (repeatable) times another checkout as well (``git archive COMMIT | tar -x -C
DIR``; its packages first on PYTHONPATH, with this venv); the trees take turns in every
repetition. Prints the median and the spread (min-max) of ``--runs``. ``--record DIR``
writes every measurement (case, tree, the tree's commit, repeat, seconds) to DIR/result.json
for ``benchmarks.archive`` (docs/results/cli.md's table: ``benchmarks.cli_tables``); a
record names each tree's commit (``--tree-commit``, one per ``--tree`` in the same order).

    python -m benchmarks.run_checks [--runs 5] [--tree /tmp/base] [--tree-commit 1521cc1] [--record DIR]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.archive import record
from benchmarks.cli_start import trees_of

CASES = {
    "digits (allreduce)": ["allreduce", "--max-iters", "1"],
    "cifar10 (allreduce, resnet18)": ["allreduce", "--dataset", "cifar10", "--model", "resnet18", "--max-iters", "1"],
    "digits (pactrain: pre-trains)": ["pactrain", "--max-iters", "1", "--pretrain-epochs", "0.2"],
}


def fake_cifar(root: Path) -> Path:
    """CIFAR-10's python release in its layout and sizes (random pixels, 10 000 per batch)."""
    import numpy as np

    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        batch = {b"data": rng.integers(0, 256, (10000, 3072), dtype=np.uint8),
                 b"labels": [int(x) for x in rng.integers(0, 10, 10000)]}
        with open(d / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    return root


def refuse_s(tree: Path | None, args: list[str], tmp: Path) -> float:
    out = Path(tempfile.mkdtemp(dir=tmp))
    env = {**os.environ, "TESTBED_STATE_DIR": str(tmp / "state")}
    if tree is not None:
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{env.get('PYTHONPATH', '')}"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "testbed.cli", "run", *args, "--testbed", "nosuch", "--out",
                        str(out / "runs")], capture_output=True, text=True, cwd=tree or Path.cwd())
    took = time.monotonic() - t0
    if p.returncode != 1 or "nosuch" not in p.stderr:
        raise SystemExit(f"{args}: expected the refusal of --testbed nosuch, got {p.returncode}: {p.stderr[-400:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", type=Path, action="append", default=[])
    ap.add_argument("--tree-commit", action="append", default=[], metavar="COMMIT",
                    help="the commit of each --tree, in the same order (needed with --record)")
    ap.add_argument("--record", type=Path, metavar="DIR", help="write every measurement to DIR/result.json")
    a = ap.parse_args()
    if a.runs < 1:
        raise SystemExit("--runs: at least 1")
    named = trees_of(a.tree, a.tree_commit, bool(a.record))
    trees: list[Path | None] = [None, *(t.resolve() for t in a.tree)]
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "state").mkdir(mode=0o700)
        data = fake_cifar(tmp / "cifar")
        times: dict = {}
        for _ in range(a.runs):
            for name, args in CASES.items():
                args = [*args, "--data-dir", str(data)] if "cifar" in name else args
                for tree in trees:
                    times.setdefault((name, tree), []).append(refuse_s(tree, args, tmp))
    print(f"| refusal of `--testbed nosuch` | {' | '.join(str(t or 'this tree') for t in trees)} |")
    print(f"|---|{'---|' * len(trees)}")
    for name in CASES:
        cells = [times[(name, t)] for t in trees]
        print(f"| {name} | " + " | ".join(f"{statistics.median(c):.2f} s ({min(c):.2f}-{max(c):.2f})"
                                           for c in cells) + " |")
    if a.record:
        rows = [{"case": name, "tree": i, "commit": named[i]["commit"], "repeat": k, "s": v}
                for name in CASES for i, t in enumerate(trees) for k, v in enumerate(times[(name, t)])]
        print("recorded:", record(a.record, "run_checks", rows, runs=a.runs, cpus=os.cpu_count(), trees=named,
                                  cases=CASES))


if __name__ == "__main__":
    main()
