"""Sweeps: every scheme x rate x grid point x repeat (grid, sweep), on this machine or as a
Slurm job array (slurm: submit, status, cancel; request: the request as a file; element:
one element on its node)."""
