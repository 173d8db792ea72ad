"""Runs on a testbed: one training run (experiment), its ranks (launch), sweeps, cross-traffic and reports."""
