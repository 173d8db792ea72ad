"""``python -m testbed``: the same as the ``testbed`` command."""

from .cli import main

main()
