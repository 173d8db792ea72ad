"""``python -m testbed``: the same as the ``testbed`` command."""

from testbed.cli import main

main()
