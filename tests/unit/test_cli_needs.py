"""Which commands an ordinary user's ``testbed`` runs in their rootless namespaces, from what
each command declares (testbed.cli.needs) and click's own parse of the line: no argv scan."""

from __future__ import annotations

import pytest

from testbed.cli import _parsed


@pytest.mark.parametrize("argv, command, namespaces, state, prunes", [
    (["up", "t.yaml"], "up", True, True, False),
    (["validate", "t.yaml", "--hosts", "slurm"], "validate", True, True, False),  # the topology is loaded there
    (["down", "--all"], "down", True, True, True),
    (["status"], "status", True, True, False),
    (["exec", "w0", "--", "ls", "-h"], "exec", True, True, False),  # -h after -- is the command's
    (["run", "allreduce", "--bw", "100mbit"], "run", True, True, False),
    (["run", "toyscheme", "-t", "x"], "run", True, True, False),  # a plugin's scheme: not known yet
    (["run", "--script", "x.py", "--bw", "1mbit", "a", "b"], "run", True, True, False),
    (["sweep", "--schemes", "allreduce"], "sweep", True, True, False),
    (["sweep", "--slurm", "--compute-time", "0.1", "--max-iters", "3"], "sweep", False, False, True),
    (["sweep", "--status=/tmp"], "sweep", False, False, True),
    (["sweep", "--cancel", "/tmp/x"], "sweep", False, False, True),
    (["_sweep-element", "/tmp/x"], "_sweep-element", True, True, False),
    (["link", "set", "l0", "--rate", "1mbit"], "link", True, True, False),
    (["link"], "link", True, True, False),
    (["monitor", "up"], "monitor", True, True, False),
    (["doctor"], "doctor", True, False, False),  # in them, without a state directory
    (["selftest"], "selftest", True, True, False),
    (["graph", "t.yaml"], "graph", False, False, False),
    (["graph", "--out", "page.json"], "graph", True, True, False),
    (["report", "runs/x"], "report", False, False, False),
    (["image", "build"], "image", False, False, False),
])
def test_each_command_declares_what_it_needs(argv, command, namespaces, state, prunes):
    p = _parsed(argv)
    assert p is not None and (p.command, p.namespaces, p.state, p.prunes) == (command, namespaces, state, prunes)


@pytest.mark.parametrize("argv", [["--version"], ["--install-completion"], ["up", "--help"], ["graph", "-h"],
                                  ["nosuch"], []])
def test_help_the_apps_own_options_and_what_click_refuses_need_nothing(argv, capsys):
    assert _parsed(argv) is None
    assert capsys.readouterr().out == ""  # --version, completion: nothing acted while parsing
