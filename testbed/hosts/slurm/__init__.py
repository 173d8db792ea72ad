"""A Slurm job's nodes as hosts: the job and its hosts (job), one step on a node (step), a
node as a multi-host testbed's host (host), a run's files there (files), a rank's step (relay)."""
