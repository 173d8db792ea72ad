"""``python -m collectors.dashboards``: regenerate the committed dashboards."""

from .build import main

main()
