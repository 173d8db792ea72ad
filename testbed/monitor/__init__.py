"""Monitoring plumbing: Prometheus' file-based service discovery (listen addresses, target files) and control of a real Prometheus server."""
