"""`testbed run|sweep --script FILE` / `-m MODULE`: the user's own training code instead of a
built-in scheme; its checks, made before anything is built."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from testbed.cli.params import scheme_variant
from testbed.cli.render import usage
from testbed.cli.workload import WORKLOAD_OPTIONS
from testbed.common.errors import TestbedError

ScriptOpt = typer.Option(None, "--script", metavar="FILE", help="Run your own training script on every worker "
                         "instead of SCHEME, started as torchrun starts it (RANK, WORLD_SIZE, MASTER_ADDR, ...); "
                         "arguments after `--` go to it. Its records: see $TESTBED_RECORDS in docs/workloads.md.")
ModuleOpt = typer.Option(None, "-m", "--module", metavar="MODULE", help="Like --script, for a module (python -m "
                         "MODULE), importable by the workers' Python or from the current directory.")
ParamOpt = typer.Option(None, "--param", metavar="KEY=V1,V2", help="A parameter grid: each run gets one value "
                        "as --KEY VALUE after the arguments after `--` (repeatable: every combination runs); a "
                        "scheme's own parameter (e.g. hook, topk-ratio) goes to the schemes that have it. Report "
                        "groups runs by it.")

TRAINER_ONLY = {name for name, _, _ in WORKLOAD_OPTIONS} | {"pretrain", "pretrain_dataset", "pretrain_epochs",
                                                             "schemes", "prune_ratios"}
"""`run`'s and `sweep`'s options that configure the built-in trainer (refused with the user's own code)."""
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def user_code(ctx: typer.Context, scheme: Optional[str], script: Optional[Path], module: Optional[str]):
    """The UserCode to run (None: the built-in SCHEME, checked), after checking that the command
    line asks for one of them and, for the user's code, nothing that only the built-in trainer
    takes (a SCHEME given with --script/-m is the code's first argument)."""
    code = own_code(ctx, script, module)
    if code is None:
        if scheme is None:
            raise usage("give a SCHEME (e.g. `testbed run pactrain`), or your own code with --script FILE or -m MODULE")
        try:
            scheme_variant(scheme)
        except typer.BadParameter as e:
            raise usage(f"Invalid value for '[SCHEME]': {e}") from None
    return code


def own_code(ctx: typer.Context, script: Optional[Path], module: Optional[str]):
    """The UserCode of --script/-m (None when neither is given), after checking that nothing
    that only the built-in trainer takes is on the command line."""
    from testbed.runs.request import UserCode

    if script is None and module is None:
        return None
    if script is not None and module is not None:
        raise usage("give --script FILE or -m MODULE, not both")
    given = [p for p in ctx.command.params if p.name is not None and p.name in TRAINER_ONLY
             and getattr(ctx.get_parameter_source(p.name), "name", "") == "COMMANDLINE"]  # typer vendors click
    if given:
        flag = given[0].opts[0]
        raise usage(f"{flag} configures the built-in trainer; your code takes its own arguments: put them after `--`")
    if module is not None:
        if not MODULE_NAME.fullmatch(module):
            raise TestbedError(f"-m {module!r} is not a module name", "e.g. -m mypkg.train")
        return UserCode.module(module, Path.cwd())
    assert script is not None  # neither given: returned above; -m: returned just now
    return UserCode.script(_script_file(script))


def _script_file(script: Path) -> Path:
    from testbed.common.files import check_regular

    try:
        check_regular(script, "script", "--script")
    except OSError as e:
        raise TestbedError(f"--script {script}: {e.strerror}", "give the path of your training script") from None
    return script
