"""The topology model: pure data and parsing (topology files, units, traces, cross-traffic flows, the keys each backend takes). No netlink, no I/O beyond reading the file."""
