"""Hosts over SSH (paramiko, host keys verified): the connection and a host's agent (client),
a command relayed into a node on another host (relay)."""
