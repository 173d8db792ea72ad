"""``python -m testbed.nsexec NETNS -- CMD [ARGS...]``: run CMD inside a testbed namespace.

Like ``ip netns exec``: joins the network namespace, remounts /sys in a private mount
namespace so /sys/class/net shows the node's interfaces, then execs CMD (no shell).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m testbed.nsexec NETNS -- CMD [ARGS...]", file=sys.stderr)
        return 2
    from .errors import TestbedError
    from .net import netns

    try:
        netns.enter(argv[0])
    except TestbedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        os.execvp(argv[2], argv[2:])
    except FileNotFoundError:
        print(f"error: command not found: {argv[2]}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"error: permission denied: {argv[2]}", file=sys.stderr)
        return 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
