"""Start one training rank per worker node, watch them, stop them all on the first failure.

Each rank runs inside its node (through the node's backend) with its environment pinned
to the data plane: MASTER_ADDR is rank 0's data-plane address, GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME name the node's data-plane interface, NCCL is told to use TCP sockets
only (no InfiniBand, peer-to-peer or shared memory, a distinct host id per node), and
CUDA_VISIBLE_DEVICES comes from the node's ``gpu:``; for a GPU run (backend auto or nccl)
namespace workers without one share the host's GPUs round-robin by rank. Output goes to ``rank{R}.log``.

torchrun's variables say what a worker is: a node with one process and (for a GPU run) the
one GPU its CUDA_VISIBLE_DEVICES shows, so LOCAL_RANK is 0, LOCAL_WORLD_SIZE 1 and
GROUP_RANK the rank: ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` works in
every rank. Where it sits (``placement``) has names of its own: TESTBED_SWITCH_INDEX (the
switch's index, switches numbered in the order of their lowest rank), TESTBED_SWITCH_RANK
and TESTBED_SWITCH_SIZE (the rank's place in and the size of that switch's group), plus
TESTBED_SWITCH, TESTBED_HOST and TESTBED_PLACEMENT (the run's placement.json).
``workloads.placement`` reads them.

Ranks of built-in workloads on netns workers of this host are forked from the run's zygote
(:mod:`testbed.nodes.zygote.launcher`: torch imported once per run, not once per rank), each through
a client that stands for its rank in the node; ``TESTBED_ZYGOTE=0`` turns that off, and a
rank the zygote cannot take starts as before.

A rank that exits non-zero or is killed ends the run at once; so does a run in which no
rank has made progress (a new line in its log or records, or in the zygote's log while it
starts them) for ``timeout`` seconds. The
others are stopped (SIGTERM, then SIGKILL), and the error names the rank and shows the
tail of its log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed.hosts.runplace import LocalRun, RunPlace
from testbed.nodes.zygote import launcher as zygotes
from testbed.nodes.nsexec import DIE_WITH_PARENT
from testbed.nodes.zygote.launcher import Zygote
from testbed.nodes.zygote.client import SOCKET_ENV
from testbed.plan.ledger import Ledger
from testbed.common.errors import TestbedError
from testbed.common.files import tail_text, write_json
from testbed.common.outdir import OutDir
from workloads.collectives import RECORDER_ENTRIES

COLLECT_EVERY_S = 2.0
MASTER_PORT = 29500  # every node has its own network stack: no clash between testbeds
STOP_GRACE_S = 3.0


class RankFailed(TestbedError):
    """A rank failed, was killed, or the run hung; the message names the rank."""


@dataclass
class RankProc:
    rank: int
    node: str
    proc: subprocess.Popen
    log: Path
    records: Path
    host: str = "local"
    where: str = ""
    """How a failure names the host (empty for this one)."""
    last_progress: float = field(default_factory=time.monotonic)
    _sizes: tuple[int, int] = (0, 0)
    exited_at: float | None = None  # monotonic time its exit was reaped
    woken: threading.Event | None = None
    """Set when it exits: the launcher's wait looks at once rather than at its next poll."""

    def __post_init__(self) -> None:
        # When one rank dies its peers fail within milliseconds (connection reset), often
        # before the next poll: the reaper's timestamp says which one went first.
        threading.Thread(target=self._reap, name=f"reap-rank{self.rank}", daemon=True).start()

    def _reap(self) -> None:
        self.proc.wait()
        self.exited_at = time.monotonic()
        if self.woken is not None:
            self.woken.set()

    def progressed(self) -> bool:
        sizes = (_size(self.log), _size(self.records))
        if sizes != self._sizes:
            self._sizes = sizes
            self.last_progress = time.monotonic()
            return True
        return False


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:
        return 0


def tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return "(no log)"
    text = tail_text(path)
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"


@dataclass(frozen=True)
class Seat:
    """Where one rank sits: its switch domain and its place in it."""

    rank: int
    node: str
    switch: str
    """The switch the worker's link reaches (the worker's own name if it reaches no switch)."""
    group_rank: int
    local_rank: int
    local_world_size: int
    host: str = "local"

    def env(self) -> dict[str, str]:
        """The placement variables (torchrun's own are rank_env's: one process per worker)."""
        return {"TESTBED_SWITCH_INDEX": str(self.group_rank), "TESTBED_SWITCH_RANK": str(self.local_rank),
                "TESTBED_SWITCH_SIZE": str(self.local_world_size), "TESTBED_SWITCH": self.switch,
                "TESTBED_HOST": self.host}


def placement(topology) -> list[Seat]:
    """A seat per worker, in rank order (rank r = topology.workers[r])."""
    workers = topology.workers
    switches = {n.name for n in topology.switches}
    domain_of = []
    for w in workers:
        link = topology.worker_link(w.name)
        other = link.b if link.a == w.name else link.a
        domain_of.append(other if other in switches else w.name)
    order = list(dict.fromkeys(domain_of))  # first appearance = lowest rank
    seats = []
    for rank, (w, d) in enumerate(zip(workers, domain_of)):
        members = [r for r, x in enumerate(domain_of) if x == d]
        seats.append(Seat(rank, w.name, d, order.index(d), members.index(rank), len(members), w.host))
    return seats


def placement_dict(seats: Sequence[Seat]) -> dict:
    """placement.json: the domains as workloads.placement builds them, and every rank's seat."""
    order = list(dict.fromkeys(s.switch for s in seats))
    return {"groups": [[s.rank for s in seats if s.switch == d] for d in order], "names": order,
            "hosts": [next(s.host for s in seats if s.switch == d) for d in order],
            "ranks": [{"rank": s.rank, "node": s.node, "switch": s.switch, "group_rank": s.group_rank,
                       "local_rank": s.local_rank, "local_world_size": s.local_world_size, "host": s.host}
                      for s in seats]}


def gpu_for(rank: int, pinned: int | None, gpus: Sequence[int]) -> int | None:
    """A worker's GPU: its topology's ``gpu:``, else round-robin by rank over ``gpus`` (the
    host's, for a GPU run), else none (a CPU rank)."""
    if pinned is not None:
        return pinned
    return gpus[rank % len(gpus)] if gpus else None


def rank_env(*, rank: int, world: int, node: str, iface: str, master_addr: str, gpu: int | None,
             threads: int, base: dict | None = None, seat: Seat | None = None,
             cuda_visible: str | None = None) -> dict[str, str]:
    """The environment of one rank: torchrun's variables plus data-plane pinning.
    ``cuda_visible``: CUDA_VISIBLE_DEVICES as the node's backend numbers its GPUs (default:
    the host index ``gpu``, none when it is None)."""
    env = dict(os.environ if base is None else base)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank), "MASTER_ADDR": master_addr, "MASTER_PORT": str(MASTER_PORT),
        "GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": f"={iface}",
        # NCCL over the emulated network only (docs/experiments.md): TCP sockets, no IB/P2P/SHM
        "NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
        "NCCL_HOSTID": f"testbed-{node}", "NCCL_SOCKET_NTHREADS": "1", "NCCL_NSOCKS_PERTHREAD": "1",
        "NCCL_MULTI_RANK_GPU_ENABLE": "1",
        "CUDA_VISIBLE_DEVICES": cuda_visible if cuda_visible is not None else "" if gpu is None else str(gpu),
        "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
    })
    if seat is not None:
        env.update(seat.env())
    return env


class Launcher:
    """One process per worker of ``tb``, running ``argv`` (the same for every rank)."""

    zygote: Zygote | None = None
    """The run's fork server for its local netns ranks, once started (testbed.nodes.zygote.launcher)."""

    def __init__(self, tb, argv: Sequence[str], run_dir: Path, *, timeout: float = 300.0,
                 extra_env: dict[str, str] | None = None, mounts: Sequence[Path] = (),
                 seats: Sequence[Seat] | None = None, gpus: Sequence[int] = (), code=None):
        """``argv``: ``MODULE ARGS...`` run as ``python -m`` by the node's Python; ``mounts``:
        host directories the ranks read or write (a container sees them at the same path);
        ``gpus``: the host GPUs that workers without ``gpu:`` share, round-robin by rank
        (empty: such workers see no GPU); ``code``: the user's code
        (:class:`testbed.hosts.runplace.CodeTree`), copied to the other hosts."""
        self.gpus = list(gpus)
        self.tb, self.argv, self.run_dir, self.timeout = tb, list(argv), run_dir, timeout
        self.extra_env = extra_env or {}
        self.mounts = [run_dir.resolve(), *mounts]
        self.ranks: list[RankProc] = []
        self.seats = list(seats) if seats is not None else placement(tb.topology)
        self.places: dict[str, RunPlace] = {}
        self.code = code
        self._collected = 0.0
        self._woken = threading.Event()

    _woken: threading.Event | None = None
    """Set by a rank's exit; the wait's nap ends on it (without it, after ``interval``)."""

    def start(self) -> None:
        workers = self.tb.workers
        world = len(workers)
        threads = max(1, (os.cpu_count() or 1) // world)
        master = workers[0].address
        where = self.run_dir / "placement.json"
        write_json(where, placement_dict(self.seats), indent=1)
        # every rank's command first: a node that cannot take its rank (a container restarted
        # or removed behind testbed's back) refuses the run before any rank starts
        places = [(w, self.tb.backend(w.name), self._place(w.host)) for w in workers]
        zygote = self._zygote([w for w, backend, place in places if _forkable(backend, place)])
        starts = []
        for w, backend, place in places:
            seat = self.seats[w.rank]
            assert seat.node == w.name, (seat, w.name)
            gpu = gpu_for(w.rank, w.gpu, place.host_gpus(backend, self.gpus))
            base, cuda_visible = place.environment(backend, w, gpu)
            env = rank_env(rank=w.rank, world=world, node=w.name, iface=w.iface, master_addr=master,
                           gpu=gpu, threads=threads, base=base, seat=seat, cuda_visible=cuda_visible)
            env.update(self._run_env(w.rank, where))
            argv = self.argv
            if zygote is not None and _forkable(backend, place):
                argv = zygote.client(self.argv, env)  # the rank forked from the run's zygote
            cmd, env = place.command(backend, w, argv, env)
            starts.append((w, place, cmd, env))
        # a rank dies with this process, even after kill -9 (testbed.nodes.nsexec; over SSH,
        # testbed.hosts.ssh.relay dies and the connection with it); so does the zygote
        die_with = {DIE_WITH_PARENT: str(os.getpid())}
        with OutDir(self.run_dir) as held:  # the run directory itself, whatever its path names meanwhile
            if zygote is not None:
                zygote.start([env for *_, env in starts if SOCKET_ENV in env], die_with, held)
                self.zygote = zygote
            for w, place, cmd, env in starts:
                env.update(die_with)
                log = self.run_dir / f"rank{w.rank}.log"
                with held.open_log(log.name) as f:
                    proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)  # Ctrl-C: us, not them
                self.ranks.append(RankProc(w.rank, w.name, proc, log, self.run_dir / f"rank{w.rank}.jsonl",
                                           w.host, place.where, woken=self._woken))

    def _run_env(self, rank: int, placement_file: Path) -> dict[str, str]:
        """The variables that tie a rank to this run: placement, records, the proof's counts."""
        run_dir = self.run_dir.resolve()
        env = {"TESTBED_PLACEMENT": str(placement_file.resolve()),
               "TESTBED_RUN_DIR": str(run_dir),  # the records contract (workloads.records)
               "TESTBED_RECORDS": str(run_dir / f"rank{rank}.jsonl"),
               # the proof's counts (workloads.collectives): torch's flight recorder on, and where to write them
               "TESTBED_COLLECTIVES": str(run_dir / f"collectives{rank}.json"),
               "TORCH_FR_BUFFER_SIZE": str(RECORDER_ENTRIES),
               "TESTBED_STARTED": str(run_dir / "started")}  # rank 0: training starts
        env.update(self.extra_env)
        return env

    def _zygote(self, forkable: Sequence) -> Zygote | None:
        """The run's zygote (testbed.nodes.zygote.launcher) when it serves this workload and enough
        ranks (TESTBED_ZYGOTE=0: never)."""
        if not zygotes.enabled() or not self.argv or not zygotes.serves(self.argv[0]) \
                or len(forkable) < zygotes.MIN_RANKS:
            return None
        return Zygote(self.run_dir, self.argv[0])

    def _place(self, host: str) -> RunPlace:
        """The run directory as ranks on ``host`` see it (opened once per host)."""
        if host not in self.places:
            self.places[host] = self.tb.site(host).open_run(self.run_dir, self.mounts, self.code)
        return self.places[host]

    def collect(self) -> None:
        """Bring what the ranks on other hosts wrote so far into the run directory."""
        for place in self.places.values():
            place.collect()

    def wait(self, tick: Callable[[], None] | None = None, interval: float = 0.5) -> None:
        """Return when every rank exited 0; raise RankFailed as soon as one fails or all hang.
        What ranks on other hosts write is collected every ``COLLECT_EVERY_S`` and at the end."""
        try:
            self._wait(tick, interval)
        except BaseException:
            try:
                self.collect()  # what the ranks wrote up to the failure
            except TestbedError:
                pass  # the failure says more; a host that is gone is named by it
            raise
        self.collect()
        self._stop_zygote()

    def _wait(self, tick, interval) -> None:
        while True:
            if time.monotonic() - self._collected > COLLECT_EVERY_S:
                self._collected = time.monotonic()
                try:
                    self.collect()
                except TestbedError:
                    pass  # a host that is gone shows as its ranks failing, named below
            now = time.monotonic()
            running = 0
            failed = []
            starting = self.zygote is not None and self.zygote.progressed()
            for r in self.ranks:
                rc = r.proc.poll()
                if not r.progressed() and starting:
                    r.last_progress = now  # the zygote imported or forked: the ranks' start goes on
                if rc is None:
                    running += 1
                elif rc != 0:
                    failed.append(r)
            if failed:
                if any(f.exited_at is None for f in failed):
                    time.sleep(0.05)  # its reaper thread is between reaping and stamping
                # the cause is the rank that died first; the others most likely died of it
                r = min(failed, key=lambda f: (f.exited_at is None, f.exited_at or 0.0, f.rank))
                rc = r.proc.returncode
                self.stop()
                how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
                if Ledger(self.tb.name).going():
                    raise RankFailed(f"testbed '{self.tb.name}' was taken down during the run (`testbed down`): "
                                     f"rank {r.rank} (node {r.node}{r.where}) {how} as its node went away; the other "
                                     "ranks were stopped")
                why = self.tb.why_stopped(r.node)
                if why:
                    how += f": {why}"
                raise RankFailed(f"rank {r.rank} (node {r.node}{r.where}) {how}; the other ranks were stopped. "
                                 f"Last lines of {r.log}:\n{tail(r.log)}")
            if running == 0:
                return
            stalled = [r for r in self.ranks if r.proc.poll() is None and now - r.last_progress > self.timeout]
            if stalled and len(stalled) == running:
                # a node that can say why (a VM that stopped answering) is named first
                why = {r.rank: self.tb.why_stopped(r.node) for r in stalled}
                first = min(stalled, key=lambda r: (why[r.rank] is None, r.last_progress))
                self.stop()
                done = [r for r in self.ranks if r.proc.returncode == 0]
                early = (f" Rank {done[0].rank} (node {done[0].node}) exited 0 while the others waited: a rank that "
                         "never joins the process group, or leaves it early, holds the others up." if done else "")
                cause = f": {why[first.rank]}" if why[first.rank] else " went quiet first"
                raise RankFailed(f"no progress from any rank for {self.timeout:.0f} s (--timeout); rank "
                                 f"{first.rank} (node {first.node}){cause}; all ranks were stopped.{early} "
                                 f"Last lines of {first.log}:\n{tail(first.log)}")
            if tick:
                tick()
            self._nap(interval)

    def _nap(self, interval: float) -> None:
        """``interval``, or less when a rank exits meanwhile: the run's end (and a failure) is
        seen as it happens, not up to ``interval`` later (0.5 s, which every run paid)."""
        if self._woken is None:
            time.sleep(interval)
            return
        self._woken.wait(interval)
        self._woken.clear()  # an exit after this is seen by the next poll, or wakes the next nap

    def stop(self) -> None:
        """SIGTERM every rank still running, SIGKILL what is left after a grace period."""
        alive = [r for r in self.ranks if r.proc.poll() is None]
        for r in alive:
            _signal(r.proc, signal.SIGTERM)
            _signal(r.proc, signal.SIGCONT)  # a stopped rank must run to act on SIGTERM
        deadline = time.monotonic() + STOP_GRACE_S
        for r in alive:
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(r.proc, signal.SIGKILL)
                r.proc.wait()
        self._stop_zygote()

    def _stop_zygote(self) -> None:
        if self.zygote is not None:
            self.zygote.stop()


def _forkable(backend, place: RunPlace) -> bool:
    """A rank the run's zygote can start: a netns worker of this host (it enters the node's
    namespaces; containers, VMs and other hosts start theirs as before)."""
    return getattr(backend, "name", None) == "netns" and isinstance(place, LocalRun)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """Signal the rank's whole process group (it leads its own session): helper processes
    it started (data loader workers, a shell) go with it."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
