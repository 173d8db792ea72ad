"""The checks of a run (or a sweep) that need only the options, the names and the topology:
made before pre-training and before anything is built, and changing nothing.

    preflight      a run's: its workload options (parsed once, typed), the GPUs its backend
                   needs, --out, --bw-trace, --dilation, and the testbed it would run on
    check_target   the testbed: ``-t NAME`` up, or ``--topology`` loadable and its name free;
                   workers, bottleneck links, the cross-traffic's workers, the trace's links

``testbed.runs.experiment.run`` checks again what may change meanwhile (another run's lock,
a background replay); what it finds first costs nothing to refuse here.
"""

from __future__ import annotations

from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.model.shapes import DIRECTIONS, Shape
from testbed.model.topology import Topology, load_topology
from testbed.runs import dilation
from testbed.runs.checks import check_out, discard_out, gpus_for, load_trace
from testbed.runs.request import RunRequest
from testbed.runs.testbeds import DEFAULT_TOPOLOGY


def preflight(req: RunRequest) -> None:
    """Refuse ``req`` (TestbedError, one line and a hint) for anything it can tell without
    building: nothing is left behind (an ``--out`` made to test it is removed again)."""
    gpus_for(req.compute_backend)  # parses the workload's options once (req.workload)
    dilation.check(req)
    discard_out(req.out, check_out(req.out))
    trace = load_trace(req)
    topo = check_target(req.testbed, req.topology, req.cross_traffic, trace)
    if req.dilation != 1:  # every shape and trace step can be slowed K-fold
        dilation.check_flows(list(topo.traffic if req.cross_traffic is None else req.cross_traffic), req.dilation)
        for link in topo.links:
            for d in DIRECTIONS:
                dilation.dilated(link.shape(d), req.dilation, f"link {link.name}")
        if trace is not None:
            for step in trace.steps:
                dilation.dilated(Shape(rate=step.rate), req.dilation, f"--bw-trace step at {step.at_s:g} s")


def check_target(testbed: str | None, topology: Path | None, cross_traffic: list | None = None,
                 trace=None) -> Topology:
    """The topology a run would use (the running testbed's, or the file's), checked."""
    from testbed.engine.core import Testbed, list_testbeds

    if testbed:
        topo = Testbed.attach(testbed).topology  # "not up" said here
    else:
        topo = load_topology(topology or DEFAULT_TOPOLOGY)
        if any(t["name"] == topo.name for t in list_testbeds()):
            raise TestbedError(f"a testbed named '{topo.name}' is already up",
                               f"use it with --testbed {topo.name}, or take it down first")
    workers = [n.name for n in topo.workers]
    if not workers:
        raise TestbedError(f"testbed '{topo.name}' has no worker nodes")
    bottlenecks = [l for l in topo.links if l.bottleneck]
    if not bottlenecks:
        raise TestbedError(f"testbed '{topo.name}' has no bottleneck links, so the run cannot prove "
                           f"its traffic crossed shaped links",
                           "mark the links between switches with 'bottleneck: true' in the topology")
    from testbed.model.flows import check_flows

    check_flows(list(topo.traffic if cross_traffic is None else cross_traffic), workers)
    if trace is not None:
        from testbed.engine.replay import check as check_trace

        check_trace(bottlenecks, trace)
    return topo
