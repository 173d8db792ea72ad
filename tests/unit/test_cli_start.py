"""The command starts at once (issue 44): a command imports only what it uses.

`testbed --version`, `--help` and every command's parsing import no netlink, Docker SDK,
torch, plotting or YAML; a rank's launcher (``python -m testbed.nodes.nsexec``) imports
none of them either before it execs. Each check runs in a fresh interpreter, so that what
another test imported does not hide an import. benchmarks/cli_start.py times the commands.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("pyroute2", "docker", "torch", "matplotlib", "numpy", "yaml", "prometheus_client", "paramiko", "requests")


def _imported(code: str) -> set[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


@pytest.mark.parametrize("code", [
    "import testbed",
    "import testbed.cli",
    # the click command built, as every invocation (--version, --help) builds it
    "import typer, testbed.cli as c; typer.main.get_command(c.app)",
    "import testbed.nodes",
    "import testbed.nodes.nsexec",  # a rank's launcher: it needs only to enter the node and exec
])
def test_imports_nothing_heavy(code):
    assert _imported(code) == set()


def test_backends_load_on_first_use():
    """The backend registry names every backend without importing one; asking for one
    imports that one."""
    probe = ("import sys, testbed.nodes as n\n"
             "before = [m for m in ('testbed.nodes.netns', 'testbed.nodes.docker.backend', 'testbed.nodes.vm.backend') if m in sys.modules]\n"
             "names = n.names(); b = n.get('netns')\n"
             "print(before, names, b.name, 'testbed.nodes.docker.backend' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert r.stdout.split("\n")[0] == "[] ('netns', 'docker', 'vm') netns False"
