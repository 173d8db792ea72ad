"""Run a user's own training script or module in a rank, as ``torchrun`` would start it.

    python -P -m workloads.userscript FILE [ARGS...]                 like ``python FILE ARGS``
    python -P -m workloads.userscript --module MOD --path DIR [ARGS...] like ``python -m MOD ARGS`` in DIR

`testbed run --script FILE` / `-m MOD` starts this in every worker with torchrun's
environment already set (RANK, WORLD_SIZE, MASTER_ADDR, ...): the user's code runs as
``__main__`` with ``sys.argv`` as it expects. FILE's directory goes first on ``sys.path``
(so the script imports its sibling modules, as ``python FILE`` allows); for a module, DIR
(the directory `testbed run` was started from, as ``python -m`` would use) does. Nothing
else of the rank's working directory (the run directory) is importable.

Every collective the script issues, whoever calls it, is counted for testbed's proof
(``workloads.collectives``; nothing in the script changes).

The exit status is the script's: ``sys.exit(n)`` and an uncaught exception end the rank as
they end ``python FILE``. The rank then leaves without the interpreter's teardown (as
``workloads.train`` does): a process group still alive at exit can abort the process in
torch's destructors ("terminate called without an active exception", measured with gloo
across a testbed), which would turn a finished rank into a killed one.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from workloads import collectives


def _usage() -> int:
    print("usage: python -m workloads.userscript FILE [ARGS...] | --module MOD --path DIR [ARGS...]", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    if argv[:1] == ["--module"]:
        if len(argv) < 4 or argv[2] != "--path":
            return _usage()
        module, path, rest = argv[1], argv[3], argv[4:]
        sys.path.insert(0, os.path.abspath(path))
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    if not argv or argv[0].startswith("-"):
        return _usage()
    script, rest = os.path.abspath(argv[0]), argv[1:]
    sys.path.insert(0, os.path.dirname(script))
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")
    return 0


def _status(code) -> int:
    """sys.exit's argument as an exit status (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run(argv: list[str]) -> int:
    collectives.activate(started_at_init=True)  # under testbed: count what the script hands to torch.distributed
    try:
        return main(argv)
    except SystemExit as e:
        return _status(e.code)
    except BaseException:  # noqa: BLE001 - printed as python would, then the rank's status
        traceback.print_exc()
        return 1
    finally:
        collectives.finish()


if __name__ == "__main__":
    status = run(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
