"""Is a worker's container still the one ``up`` wired into the testbed?

Docker can change a container behind testbed's back, and each way leaves the node unfit
for ranks in its own way:

* ``docker rm -f``: the container is gone (its status reads ``removing`` for a moment);
* ``docker stop`` / ``kill``, or the engine stopped (containers without a restart policy
  stop with it): the container is not running;
* ``docker restart`` (or stop then start): it runs again, but in a **new network
  namespace** holding only loopback. The worker's veth end, its address and its shaping
  stayed in the namespace ``up`` made and named under /run/netns, so nothing would cross
  the testbed's links: no process may be started there as if it did.

The last is told by comparing the container's init's network namespace with the one the
testbed named (their inodes), the check :mod:`testbed.nodes.nsexec` also makes before it
enters a container; a reused pid cannot pass it.

Each reason reads as the tail of a sentence about the node ("its container X was removed
..."), which :class:`testbed.nodes.docker.backend.DockerBackend` puts after the node's name in an
error, or hands the launcher to put after a rank's fate; :func:`redo` says what to do.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path

from testbed.common.errors import TestbedError
from testbed.net import netns
from testbed.nodes.docker.api import ENGINE_HINT, docker_sdk

SETTLE_S = 2.0
"""How long :func:`settled_reason` watches a stopped container: ``docker restart`` runs it
again within about a second, and then the reason is the restart, not the stop."""
SOCKET = "/var/run/docker.sock"


class EngineDown(TestbedError):
    """The Docker engine does not answer."""


def inspect(name: str, timeout: float = 60):
    """Container ``name`` as the engine sees it now; None when the engine has no such
    container; EngineDown when the engine does not answer."""
    docker = docker_sdk()
    try:
        dc = docker.from_env(timeout=timeout)
    except docker.errors.DockerException as e:
        raise EngineDown(f"cannot reach the Docker engine: {e}", ENGINE_HINT) from None
    try:
        return dc.containers.get(name)
    except docker.errors.NotFound:
        return None
    except Exception as e:  # requests' connection errors, an engine shutting down (APIError 500)
        raise EngineDown(f"the Docker engine did not answer about {name}: {e}", ENGINE_HINT) from None
    finally:
        dc.close()


def testbed_of(ns: str) -> str:
    """The testbed of node namespace ``NAME.NODE`` (``.`` occurs in neither name)."""
    return ns.split(".", 1)[0]


def redo(testbed: str) -> str:
    return f"`testbed down {testbed}` and `testbed up` again"


def gone(name: str) -> str:
    return f"its container {name} was removed (it is no longer on the Docker engine)"


ENGINE_DOWN = ("the Docker engine does not answer: it was stopped or is restarting, and containers without a "
               "restart policy stop with it")


def same_namespace(ns: str, pid: int) -> bool:
    """Whether process ``pid`` lives in the testbed's network namespace ``ns``."""
    try:
        return os.stat(netns.path(ns)).st_ino == os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return False


def parse_time(iso: str | None) -> datetime | None:
    """Docker's RFC 3339 time (``2026-11-24T07:51:06.220493596Z``); None for Docker's zero."""
    if not iso or iso.startswith("0001-"):
        return None
    head = iso.rstrip("Z").partition(".")[0].partition("+")[0]
    try:
        return datetime.fromisoformat(head).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def _when(t: datetime | None, raw: str | None = None) -> str:
    return f"{t:%Y-%m-%d %H:%M:%S} UTC" if t else (raw or "?")


def engine_started() -> datetime | None:
    """When the local engine last started (its unix socket is made then); None when it is
    reached another way, or its socket is not there."""
    host = os.environ.get("DOCKER_HOST", f"unix://{SOCKET}")
    if not host.startswith("unix://"):
        return None
    try:
        return datetime.fromtimestamp(Path(host[len("unix://"):]).stat().st_ctime, timezone.utc)
    except OSError:
        return None


def reason(c, ns: str) -> str | None:
    """Why container ``c`` (as inspected) cannot run the processes of the node whose
    network namespace is ``ns``; None when it can."""
    st = c.attrs["State"]
    status = st.get("Status")
    if status == "removing" or st.get("Dead"):
        return f"its container {c.name} was removed (docker rm)"
    if not st.get("Running"):
        why = f"its container {c.name} is {status} (exit code {st.get('ExitCode')})"
        started, engine = parse_time(st.get("StartedAt")), engine_started()
        if started and engine and engine > started:
            why += (f": the Docker engine restarted at {_when(engine)}, and containers without a restart policy "
                    "stop with it")
        return why
    if not same_namespace(ns, st.get("Pid") or 0):
        started = st.get("StartedAt")
        return (f"its container {c.name} was restarted (started again at {_when(parse_time(started), started)}, "
                "after `up` wired it): its network namespace is new, so its links into the testbed are gone")
    return None


def settled_reason(name: str, ns: str, settle: float = SETTLE_S) -> str | None:
    """:func:`reason` for container ``name`` once what Docker is doing to it has settled (a
    stopped container is watched up to ``settle`` seconds: a ``docker restart`` runs it
    again meanwhile); also when it is gone or the engine does not answer."""
    deadline = time.monotonic() + settle
    while True:
        try:
            c = inspect(name, timeout=10)
        except EngineDown:
            return ENGINE_DOWN
        if c is None:
            return gone(name)
        why = reason(c, ns)
        stopped = why is not None and c.attrs["State"].get("Status") in ("exited", "created", "restarting")
        if not stopped or time.monotonic() >= deadline:
            return why
        time.sleep(0.2)
