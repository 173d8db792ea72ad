"""The docker backend: a worker is a container on this host's Docker engine.

The container starts with ``network_mode=none`` (only loopback), labelled ``testbed=NAME``,
``testbed.node=NODE`` and ``testbed.state=<state dir>``. Its network namespace is then
named under /run/netns (a bind mount, as ``ip netns attach`` makes), and from there on the
plan treats it exactly like a netns worker: the worker's veth end is created straight
into it as ``eth0``, addressed, shaped with the same HTB tree, and sysctls are written
inside it. So links, ``link set``, counters and the exporter need no Docker code.

Processes run inside the container through :mod:`testbed.nodes.nsexec`, which enters the
container's namespaces (network, UTS, IPC, PID, mount) and its cgroups the way ``docker
exec`` does, with one addition: host directories a run needs (its run directory, a
checkpoint) are mounted into a private copy of the container's mount namespace at the
same path, so ranks write their records straight onto the host: a crash loses nothing,
and nothing has to be copied back.

A container changed behind testbed's back (removed, stopped, restarted into a new network
namespace that lacks the node's links, or stopped with the engine) is refused before a
process starts in it, and named when a rank in it dies (:mod:`testbed.nodes.docker.health`).

The Docker engine is reached through the docker SDK (``pip install docker``), never the
CLI. Images: ``testbed image build`` makes ``testbed/worker:cpu`` offline; see images/.
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

from testbed.plan import naming
from testbed.common import procs
from testbed.common.state import state_root
from testbed.plan.actions import ApplyContext, Action, Teardown, register
from testbed.common.errors import TestbedError
from testbed.model.backend_options import DEFAULT_IMAGE, DEFAULT_SHM
from testbed.nodes.base import Backend, Check
from testbed.nodes.docker.api import any_labelled, client, docker_sdk
from testbed.nodes.docker import health
from testbed.nodes.docker.api import not_found as _not_found
from testbed.nodes import images

@register
@dataclass(frozen=True)
class StartContainer(Action):
    """Create and start a worker's container; name its network namespace ``ns``."""

    ns: str
    tag: str
    container: str
    testbed: str
    node: str
    state: str
    image: str = DEFAULT_IMAGE
    cpus: float | None = None
    memory: str | None = None
    shm_size: str = DEFAULT_SHM
    env: tuple = ()
    volumes: tuple = ()
    gpu: int | None = None
    creates_namespace: ClassVar[bool] = True

    def describe(self) -> str:
        return f"container {self.container} from {self.image} (netns {self.ns}, lo alias {self.tag})"

    def labels(self) -> dict[str, str]:
        return {"testbed": self.testbed, "testbed.node": self.node, "testbed.state": self.state}

    def apply(self, ctx: ApplyContext) -> None:
        docker = docker_sdk()
        kw: dict[str, Any] = dict(
            name=self.container, hostname=self.node, labels=self.labels(), network_mode="none",
            entrypoint=["sleep", "infinity"], init=True, detach=True, shm_size=self.shm_size,
            environment=list(self.env), volumes=list(self.volumes))
        if self.cpus:
            kw["nano_cpus"] = int(self.cpus * 1e9)
        if self.memory:
            kw["mem_limit"] = self.memory
        if self.gpu is not None:
            kw["device_requests"] = [docker.types.DeviceRequest(device_ids=[str(self.gpu)], capabilities=[["gpu"]])]
        try:
            c = ctx.host.docker().containers.run(self.image, **kw)
            c.reload()
        except docker.errors.ImageNotFound:
            raise TestbedError(f"node {self.node}: image {self.image} is not on this host",
                               "build it offline with `testbed image build`, or docker pull/build it") from None
        except docker.errors.DockerException as e:
            raise TestbedError(f"node {self.node}: starting container {self.container} failed: {e}") from None
        pid = c.attrs["State"].get("Pid") or 0
        if not c.attrs["State"].get("Running") or pid <= 0:
            raise TestbedError(f"node {self.node}: container {self.container} exited at start "
                               f"({c.attrs['State'].get('Status')})", f"docker logs {self.container}")
        ctx.host.attach_netns(self.ns, pid).init_namespace(self.tag)

    def release(self, td: Teardown) -> None:
        remove_container(td.host.docker(), self.container, self.labels())
        td.kill_in.append(self.ns)  # host-side helpers that joined its namespace (nsexec)

    def undo(self, td: Teardown) -> None:
        td.host.remove_netns(self.ns)


def remove_container(dc, name: str, labels: dict[str, str]) -> bool:
    """Remove container ``name`` if it carries ``labels`` (never another's of that name)."""
    try:
        c = dc.containers.get(name)
    except Exception as e:
        if _not_found(e):
            return False
        raise TestbedError(f"cannot inspect container {name}: {e}") from None
    if any(c.labels.get(k) != v for k, v in labels.items()):
        raise TestbedError(f"container {name} exists but is not this testbed's (labels {c.labels})",
                           "left alone; remove it by hand if it is stale")
    try:
        c.remove(force=True, v=True)
    except Exception as e:
        if _not_found(e):
            return False
        raise TestbedError(f"removing container {name} failed: {e}") from None
    return True


class DockerBackend(Backend):
    name = "docker"
    needs_root = "its containers are made by the Docker engine, a daemon of root's (rootless Docker is not supported)"


    # ------------------------------------------------------------- host-wide duties
    def checks(self) -> list[Check]:
        ok, detail = images.status(images.DEFAULT_TAG)
        return [_engine_check(), Check("worker image", ok, detail, None if ok else
                                       "`sudo $(command -v testbed) image build` (offline; only for the docker backend)")]

    def build_image(self, say, force: bool = False, tag: str = images.DEFAULT_TAG, **_) -> dict:
        return images.build(tag, say=say, force=force)

    def recover(self, testbeds: set[str] | None, problems: list[str]) -> list[str]:
        """Containers labelled as made from this state directory (a lost ledger's)."""
        return _remove_labelled_containers(problems, testbeds)

    def plan_node(self, testbed: str, node, ns: str, tag: str, address: str, sysctls: tuple) -> list:
        o = dict(node.options)
        return [StartContainer(ns, tag, naming.container_name(ns), testbed, node.name, str(state_root()),
                               image=o.get("image", DEFAULT_IMAGE), cpus=o.get("cpus"), memory=o.get("memory"),
                               shm_size=o.get("shm_size", DEFAULT_SHM), env=o.get("env", ()),
                               volumes=o.get("volumes", ()), gpu=node.gpu), *self.namespace_sysctls(ns, sysctls)]

    def preflight(self, nodes: Sequence) -> None:
        """Engine reachable and every image present, before anything is created."""
        docker = docker_sdk()
        dc = client()
        for image in dict.fromkeys(dict(n.options).get("image", DEFAULT_IMAGE) for n in nodes):
            try:
                dc.images.get(image)
            except docker.errors.ImageNotFound:
                user = [n.name for n in nodes if dict(n.options).get("image", DEFAULT_IMAGE) == image]
                raise TestbedError(f"image {image} (nodes {', '.join(user[:4])}) is not on this host",
                                   "build the default offline with `testbed image build`, or docker build/pull yours"
                                   ) from None

    # ------------------------------------------------------------------ processes
    def _container(self, info):
        name = naming.container_name(info.netns)
        c = health.inspect(name)
        if c is None:
            raise TestbedError(f"node {info.name}: {health.gone(name)}", health.redo(health.testbed_of(info.netns)))
        return c

    def _pid(self, info) -> int:
        """The pid of the container's init, once the container is the one `up` wired (running,
        in the namespace that holds the node's links), else a TestbedError saying why not."""
        c = self._container(info)
        why = health.reason(c, info.netns)
        if why:
            raise TestbedError(f"node {info.name}: {why}", health.redo(health.testbed_of(info.netns)))
        return c.attrs["State"]["Pid"]

    def command(self, info, argv: Sequence[str], *, mounts: Sequence[Path] = (), cwd: Path | None = None) -> list[str]:
        args = ["--container", str(self._pid(info)), "--netns", info.netns]
        for m in mounts:
            args += ["--mount", str(Path(m).resolve())]
        if cwd is not None:
            args += ["--cwd", str(Path(cwd).resolve())]
        return procs.python_argv("testbed.nodes.nsexec", *args, "--", *argv)

    def python(self, info) -> str:
        return "python3"

    shares_host_gpus = False  # a container has only the GPU it was created with (gpu:)

    def cuda_visible(self, info, gpu: int | None) -> str:
        # the container was given host GPU ``gpu:`` as a device request: inside it, that
        # GPU is the only one, numbered 0 (host index N would hide it)
        return "" if gpu is None else "0"

    def environment(self, info) -> dict[str, str]:
        env = {}
        for kv in self._container(info).attrs["Config"].get("Env") or []:
            k, _, v = kv.partition("=")
            env[k] = v
        return env

    def why_stopped(self, info) -> str | None:
        """Why a rank in this node may have died: its container was removed, stopped (by hand,
        or with the engine), or restarted into a new network namespace; or the engine is down."""
        why = health.settled_reason(naming.container_name(info.netns), info.netns)
        return None if why is None else f"{why}; {health.redo(health.testbed_of(info.netns))}"

    def stop(self, info) -> None:
        from testbed.net import netns

        c = self._container(info)
        if not c.attrs["State"].get("Running"):
            raise TestbedError(f"node {info.name}: container {c.name} is not running ({c.attrs['State'].get('Status')})",
                               "`testbed down` then `testbed up` rebuilds it")
        keep = {c.attrs["State"]["Pid"]}
        keep |= {p for p in netns.pids_in([info.netns]) if procs.parent_of(p) in keep}  # init's own child
        netns.kill_processes([info.netns], exclude=keep)

    # ------------------------------------------------------------------ files
    def put(self, info, src: Path, dst: str) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(src), arcname=Path(dst).name)
        if not self._container(info).put_archive(str(Path(dst).parent), buf.getvalue()):
            raise TestbedError(f"node {info.name}: copying {src} to {dst} failed")

    def get(self, info, src: str, dst: Path) -> None:
        try:
            stream, _ = self._container(info).get_archive(src)
        except Exception as e:
            raise TestbedError(f"node {info.name}: cannot read {src}: {e}") from None
        buf = io.BytesIO(b"".join(stream))
        with tarfile.open(fileobj=buf) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member is not None else None
            if f is None:
                raise TestbedError(f"node {info.name}: {src} is not a regular file")
            Path(dst).write_bytes(f.read())


def _engine_check() -> Check:
    sock = "/var/run/docker.sock"
    try:
        docker = docker_sdk()
        try:
            client = docker.from_env(timeout=3)
            v = client.version().get("Version", "?")
            return Check("docker engine", True, f"engine {v} answers on {sock}")
        except Exception as e:  # the SDK raises many types; all mean "not usable"
            return Check("docker engine", False, f"not reachable: {type(e).__name__}",
                         "apt-get install docker.io and start dockerd (only for the docker backend)")
    except TestbedError:
        ok = os.path.exists(sock)
        return Check("docker engine", ok, f"socket {sock} {'present' if ok else 'absent'} (docker SDK not installed)",
                     None if ok else "apt-get install docker.io and start dockerd (only for the docker backend)")


def _remove_labelled_containers(problems: list[str], names: set[str] | None = None) -> list[str]:
    """Containers labelled as made from this state directory (a lost ledger's)."""
    if any_labelled(f"testbed.state={state_root()}") is False:
        return []  # asked without importing the SDK: every `down` asks, and there are none
    try:
        docker = docker_sdk()
    except TestbedError:
        return []
    try:
        dc = docker.from_env(timeout=30)
        found = dc.containers.list(all=True, filters={"label": f"testbed.state={state_root()}"})
    except docker.errors.DockerException:
        return []  # no engine: no containers can exist
    owners = []
    try:
        for c in found:
            if names is not None and c.labels.get("testbed") not in names:
                continue
            try:
                c.remove(force=True, v=True)
                owners.append(c.labels.get("testbed", "?"))
            except docker.errors.NotFound:
                pass
            except docker.errors.DockerException as e:
                problems.append(f"removing container {c.name}: {e}")
    finally:
        dc.close()
    return owners
