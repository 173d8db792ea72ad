"""Prometheus exporters for testbed: link counters read at scrape time, training records.

Both are custom collectors (prometheus-client): nothing is sampled in the background,
so an idle exporter costs nothing, and a scrape reads exactly the kernel counters and
record files of that moment. They run on the host side and bind to 127.0.0.1 unless
told otherwise, so metric traffic never crosses an emulated link.

    python -m collectors [--listen 127.0.0.1:9464] [--testbed NAME ...] [--runs DIR ...]
"""
