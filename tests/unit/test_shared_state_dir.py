"""A state directory the user cannot use is one line with a hint, exit 1, no traceback
(issue 43), asked through the CLI so that it runs on code from before the check too
(tests/unit/test_processes.py tests state.check_root; tests/kernel/test_processes.py asks
as a real user, and that no holder is left)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_state_directory_under_a_file_is_one_line_naming_the_variable(tmp_path):
    (tmp_path / "file").write_text("")
    env = {**os.environ, "TESTBED_STATE_DIR": str(tmp_path / "file" / "state")}
    for argv in (("status",), ("down", "nosuch")):
        r = subprocess.run([sys.executable, "-m", "testbed.cli", *argv], capture_output=True, text=True,
                           env=env, timeout=120)
        assert "Traceback" not in r.stderr, (argv, r.stderr)
        assert r.returncode == 1, (argv, r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert str(tmp_path / "file") in lines[0] and "TESTBED_STATE_DIR" in r.stderr, (argv, r.stderr)
        assert len(lines) <= 2 and lines[-1].lstrip().startswith("hint:"), (argv, r.stderr)
