"""Reports: what ``testbed report`` (and the docs' generated tables) read from run
directories, and only that: the runs found (rundata), the table of groups (tables) with
their paired statistics (stats), the figures (plots), TensorBoard files (tensorboard), a
trace's timeline (timeline) and time-to-accuracy composed in a GPU's regime (compose)."""
