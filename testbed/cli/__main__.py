"""``python -m testbed.cli``: the same as the ``testbed`` command."""

from testbed.cli import main

main()
