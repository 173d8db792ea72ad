"""``testbed selftest`` as a benchmark result, for a results page (docs/results/gpu.md's NCCL table).

    python -m benchmarks.selftest [--gpu] --record DIR              # runs the self-test here (root)
    python -m benchmarks.selftest --from FILE --code COMMIT --record DIR
                                      # FILE: what `testbed selftest --json` printed, COMMIT: the code it ran

Either way DIR/result.json holds the self-test's rows (each check, its expectation, what was
measured, the verdict and the data behind it), its machine line, whether it passed and how
long it took, for ``benchmarks.archive``. ``--from`` records a self-test that ran where this
checkout's tools could not be run afterwards (the lent GPU machine, whose outputs come back
as files); FILE is read as hostile input (a regular file of bounded size, the self-test's shape).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchmarks.archive import record
from benchmarks.machine import UUID
from testbed.common.errors import TestbedError
from testbed.common.files import InputError, read_json
from testbed.runs.selftest import selftest

KEYS = ("check", "expected", "measured", "verdict", "detail", "data")
VERDICTS = ("pass", "fail", "skip")
MACHINE = ("kernel", "cpus", "rootless", "netem_missing", "iperf3", "gpus")
"""What of the self-test's machine line a record keeps (it has no host name; GPU UUIDs are cut)."""


def from_file(path: Path) -> dict:
    """The self-test's result as ``testbed selftest --json`` printed it, checked for its shape."""
    try:
        data = read_json(path, "json", "self-test output")
    except (OSError, ValueError, InputError) as e:
        raise TestbedError(f"--from {path}: {getattr(e, 'message', None) or e}",
                           "give the file `testbed selftest --json` wrote") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and set(KEYS) <= set(r) for r in rows):
        raise TestbedError(f"--from {path}: no self-test rows in it", "give the file `testbed selftest --json` wrote")
    for r in rows:
        texts = [r[k] for k in KEYS if k != "data"]
        if not all(isinstance(t, str) and len(t) <= 2000 for t in texts) or r["verdict"] not in VERDICTS \
                or not isinstance(r["data"], dict):
            raise TestbedError(f"--from {path}: a row is not the self-test's ({str(r.get('check'))[:80]!r})",
                               "give the file `testbed selftest --json` wrote")
    if data.get("ok") is not all(r["verdict"] != "fail" for r in rows):
        raise TestbedError(f"--from {path}: 'ok' disagrees with its rows' verdicts", "give the file as the self-test wrote it")
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="also every scheme under NCCL (testbed selftest --gpu)")
    p.add_argument("--from", dest="source", type=Path, metavar="FILE", help="record this self-test output instead")
    p.add_argument("--code", metavar="COMMIT", help="with --from: the commit the self-test ran (git rev-parse HEAD there)")
    p.add_argument("--record", type=Path, metavar="DIR", required=True, help="write DIR/result.json")
    args = p.parse_args(argv)
    if args.source and not re.fullmatch(r"[0-9a-f]{7,40}", args.code or ""):
        p.error("--from needs --code COMMIT: the commit the self-test ran, 7 to 40 hex digits")
    try:
        if args.source:
            data = from_file(args.source)
        else:
            data = selftest(gpu=args.gpu, say=lambda m: print(m, file=sys.stderr))
    except TestbedError as e:
        print(f"selftest: {e.message}" + (f" ({e.hint})" if e.hint else ""), file=sys.stderr)
        return 1
    given = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    machine = {k: given[k] for k in MACHINE if k in given}
    if isinstance(machine.get("gpus"), list):  # a GPU's UUID names the machine, as a host name would
        machine["gpus"] = [UUID.sub("", str(g)) for g in machine["gpus"]]
    where = record(args.record, "selftest", [{k: r[k] for k in KEYS} for r in data["rows"]],
                   ok=bool(data.get("ok")), seconds=data.get("seconds"), machine=machine,
                   **({"code_version": args.code[:7]} if args.source else {}))
    print(f"recorded: {where}")
    return 0 if data.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
