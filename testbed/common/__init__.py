"""Shared by every layer: errors users see, atomic files, process helpers, the state directory, signals, the version. Imports nothing of testbed's."""
