"""Optional dependencies (extras) fail with the extra to install, not an ImportError."""

from __future__ import annotations

import subprocess
import sys

import pytest

_WITHOUT = "import sys; sys.modules[{mod!r}] = None\n"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("mod, code, extra", [
    ("docker", "from testbed.nodes.docker.api import client\nclient()", "testbed[docker]"),
    ("paramiko", "from testbed.model.topology import Host\nfrom testbed.hosts.ssh.client import connect\n"
                 "connect(Host('h1', '192.0.2.1', '192.0.2.1'))", "testbed[ssh]"),
])
def test_a_missing_extra_names_what_to_install(mod, code, extra):
    r = _run(_WITHOUT.format(mod=mod) + "from testbed import TestbedError\ntry:\n"
             + "".join(f"    {line}\n" for line in code.splitlines())
             + "except TestbedError as e:\n    print('MSG', e.message, '|', e.hint)\n")
    assert r.returncode == 0, r.stderr
    assert "MSG" in r.stdout and extra in r.stdout, r.stdout


def test_the_embedded_default_needs_no_extra():
    """netns, the default backend, loads, plans and imports its engine without docker or paramiko."""
    r = _run(_WITHOUT.format(mod="docker") + _WITHOUT.format(mod="paramiko")
             + "import testbed.cli, testbed.engine.core, testbed.runs.experiment\n"
               "from testbed import load_topology\nload_topology('three_switch')\nprint('ok')")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
