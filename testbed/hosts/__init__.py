"""Hosts, where kernel calls happen: this machine (LocalHost), others over SSH (``ssh``)
or as the nodes of a Slurm job (``slurm``), and other hosts' shares of a plan as actions."""
