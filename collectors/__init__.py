"""Prometheus exporters for testbed: link counters read at scrape time, training records.

Both are custom collectors (prometheus-client): nothing is sampled in the background,
so an idle exporter costs nothing, and a scrape reads exactly the kernel counters and
record files of that moment. They run on the host side and bind to 127.0.0.1 unless
told otherwise, so metric traffic never crosses an emulated link.

    python -m collectors [--listen 127.0.0.1:9464] (--testbed NAME ... | --all-testbeds) [--runs DIR ...]
                         [--sd-file FILE --sd-label KEY=VALUE]

`testbed up` starts one per testbed (``--testbed NAME --listen 127.0.0.1:0 --sd-file
<state dir>/targets/testbed-NAME.json``) and `testbed down` stops it; `testbed run` serves
its run's records from its own process (:class:`collectors.training.RunExporter`).
"""


from testbed.monitor.sd import bind_error, hostport, parse_listen  # noqa: E402,F401  (the address helpers live in testbed)
