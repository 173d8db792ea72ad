"""Hosts, where kernel calls happen: this machine (LocalHost), others over SSH, and other hosts' shares of a plan as actions."""
