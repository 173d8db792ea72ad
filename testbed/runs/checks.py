"""`testbed run`'s checks, made before anything changes: each refusal is a one-line error
that names the value and how to fix it, and leaves nothing behind.

    check_out       --out takes files
    gpus_for        the host GPUs a run shares (nccl on a host without any is refused)
    load_trace      --bw-trace read and checked (and not given together with --bw)
    check_testbed   the testbed has workers and bottleneck links, the cross-traffic names
                    its workers, no background replay fights --bw/--bw-trace
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from testbed.common.errors import TestbedError
from testbed.common.outdir import UnsafeDirectory, own_dir
from testbed.engine.core import Testbed
from testbed.model.topology import Link
from testbed.nodes.gpus import host_gpus
from testbed.runs.request import RunRequest

if TYPE_CHECKING:
    from testbed.model.trace import Trace


def check_out(out: Path) -> Path | None:
    """``--out`` must take files before anything is built (a clear error, nothing left).
    Returns the highest directory this made (None: ``out`` was there), for ``discard_out``."""
    import tempfile

    made = next((d for d in reversed((out, *out.parents)) if not d.exists()), None)
    try:
        own_dir(out)  # ours, and no one else's to swap (made private when new)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".testbed-write-check-"):
            pass
    except UnsafeDirectory:
        discard_out(out, made)
        raise
    except OSError as e:
        discard_out(out, made)
        raise TestbedError(f"--out {out}: cannot write there ({e.strerror or e})",
                           "choose a writable directory with free space") from None
    return made


def discard_out(out: Path, made: Path | None) -> None:
    """Remove the directories ``check_out`` made, up to ``made``, while they hold nothing: a
    run refused after the check leaves no empty ``--out`` behind (a run's files keep it)."""
    if made is None:
        return
    for d in (out, *out.parents):
        try:
            d.rmdir()
        except OSError:
            return
        if d == made:
            return


def gpus_for(backend: str) -> list[int]:
    """The host GPUs that workers without ``gpu:`` share in this run: all of them for a
    GPU run (auto or nccl), none for gloo (CPU ranks). nccl on a host without GPUs is
    refused before anything starts."""
    if backend == "gloo":
        return []
    gpus = host_gpus()
    if backend == "nccl" and not gpus:
        raise TestbedError("--backend nccl needs NVIDIA GPUs, and this host has none (nvidia-smi lists none)",
                           "use --backend gloo (CPU ranks), or run where `testbed doctor` shows GPUs")
    return gpus


def load_trace(req: RunRequest) -> Trace | None:
    """The run's bandwidth trace, read and checked before anything is built (None: no trace)."""
    if req.bw_trace is None:
        return None
    if req.bw is not None:
        raise TestbedError("--bw and --bw-trace both set the bottleneck rate", "give one of them")
    from testbed.model.trace import load_trace as read_trace

    trace = read_trace(req.bw_trace, req.trace_format, req.trace_window, req.trace_loop)
    if trace.needs_netem:
        from testbed.net.probe import netem_missing

        if detail := netem_missing():
            from testbed.net.tc import NETEM_MISSING_HINT

            raise TestbedError(f"--bw-trace {req.bw_trace}: its delay/loss columns need the netem qdisc, which this "
                               f"kernel lacks ({detail})", NETEM_MISSING_HINT)
    return trace


def check_testbed(tb: Testbed, req: RunRequest, trace: Trace | None) -> tuple[list, list[Link]]:
    """The run's cross-traffic flows and the testbed's bottleneck links, once the testbed can
    take the run. Flows a killed run left running on it are stopped on the way."""
    if len(tb.workers) < 1:
        raise TestbedError(f"testbed '{tb.name}' has no worker nodes")
    from testbed.model.flows import check_flows
    from testbed.runs.traffic import stop_leftovers

    flows = list(tb.topology.traffic if req.cross_traffic is None else req.cross_traffic)
    check_flows(flows, [w.name for w in tb.workers])
    stop_leftovers(tb.name)  # flows a killed run left running
    bottlenecks = [l for l in tb.topology.links if l.bottleneck]
    if not bottlenecks:
        raise TestbedError(f"testbed '{tb.name}' has no bottleneck links, so the run cannot prove "
                           f"its traffic crossed shaped links",
                           "mark the links between switches with 'bottleneck: true' in the topology")
    if req.bw is not None or trace is not None:
        from testbed.engine.replay import running_background

        if busy := running_background(tb.name):
            raise TestbedError(f"testbed '{tb.name}' has {len(busy)} trace replay(s) running in the background "
                               f"(pid {', '.join(str(b['pid']) for b in busy)}), which would fight --bw/--bw-trace",
                               "stop them with `testbed link replay --stop`, or run without --bw/--bw-trace")
    if trace is not None:
        from testbed.engine.replay import check as check_trace

        check_trace(bottlenecks, trace)  # refused before anything changes
    return flows, bottlenecks
