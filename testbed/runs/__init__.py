"""Runs on a testbed: one training run (experiment), its ranks (launch), the proof
(proof, bounds, volume), cross-traffic (traffic), time dilation, the self-test and the
graph page; two rooms of their own: ``sweeps`` (here, or as a Slurm job array) and
``reports`` (what reads run directories, and only that: a contract in pyproject.toml)."""
