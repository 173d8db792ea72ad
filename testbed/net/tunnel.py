"""The user-space tunnel's forwarder: one end of a link between two hosts, without root.

A link whose ends sit on different hosts, for a user without root (no VXLAN device, no
``/dev/net/tun``), is on each host a veth pair, one end the link's end in the node's
namespace, shaped with tc as every local link is, and one forwarder process holding

- a **UDP socket in the host's network namespace**, opened before the forwarder enters the
  user's namespaces and *connected* to the peer forwarder's address and port, and
- an **AF_PACKET socket on the other veth end**, inside the user's own network namespace
  (where the user, mapped to root in their user namespace, has ``CAP_NET_RAW``),

and copying frames both ways, one thread per direction. The packet socket uses
``PACKET_VNET_HDR``: a frame keeps its virtio-net header (GSO type and size, checksum
offsets), so a TCP segment of up to ~64 kB built by the node's stack (TSO on the veth, the
default) crosses in one datagram and is segmented, if ever, by the receiving kernel; without
it the tunnel tops out near 200 Mbit/s in Python (see docs/tunnel.md). Frames this socket
itself sends are not read back (``PACKET_IGNORE_OUTGOING``, else by packet type) or they
would loop. The wire format and who may send frames: :mod:`testbed.net.tunnelwire` and
:mod:`testbed.net.tunnelauth`; a third thread sends keepalives and stops sending to a peer
that went silent (:mod:`testbed.net.tunnellive`).

Run one as ``python -m testbed.net.tunnel --ifname IF --bind ADDR:PORT [--peer ADDR:PORT]
[--netns PATH] [--userns PATH]``: it reads the link's token (hex) as the first line of its
stdin (never from its arguments, which other users can read), prints ``bound ADDR PORT``,
reads ``peer ADDR PORT`` when no ``--peer`` was given, enters the namespaces, prints
``ready``, and forwards until SIGTERM/SIGINT/SIGHUP (or, with ``--stdin-lifetime``, until its
stdin closes); then it prints its counters as one JSON line on stderr and exits. It leaves
nothing behind: its sockets close with it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import sys
import threading
from dataclasses import asdict, dataclass

from testbed.net import tunnelwire as wire
from testbed.net.tunnellive import PeerWatch, Timing, peer_words

SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
PACKET_STATISTICS = 6
ETH_P_ALL = 0x0003
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SOCKET_BUFFER = 4 << 20
"""Bytes asked for each socket's queues (the UDP socket gets at most net.core.rmem_max /
wmem_max; the packet socket, in a namespace the user owns, gets this much)."""
LINE_MAX = 512
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_libc = ctypes.CDLL(None, use_errno=True)


class TunnelError(RuntimeError):
    """The forwarder could not start; the message says why."""


@dataclass
class Counters:
    """What one forwarder has moved and dropped (per direction)."""

    frames_out: int = 0
    """Frames read from the veth and sent to the peer."""
    bytes_out: int = 0
    frames_in: int = 0
    """Frames from the peer written to the veth."""
    bytes_in: int = 0
    split_out: int = 0
    """Frames sent in several datagrams (longer than one datagram holds)."""
    rejected: int = 0
    """Datagrams that are too short, have another magic or fail their tag (dropped)."""
    replayed: int = 0
    """Authentic datagrams whose counter was seen already or is older than the window (dropped)."""
    reflected: int = 0
    """Authentic datagrams that name this forwarder as their sender: its own, sent back (dropped)."""
    keepalives_out: int = 0
    """Datagrams without a frame sent (the link was idle, or a probe to a silent peer)."""
    keepalives_in: int = 0
    dropped_out: int = 0
    """Frames that could not be sent to the peer (too long, peer not there, queue full)."""
    dropped_silent: int = 0
    """Frames not sent because the peer was silent (:mod:`testbed.net.tunnellive`)."""
    dropped_in: int = 0
    """Frames from the peer the veth refused, or parts that did not make a frame."""
    packet_socket_drops: int = 0
    """Frames the kernel dropped before we read them (the packet socket's queue was full)."""


# --------------------------------------------------------------------------- sockets
def _buffers(sock: socket.socket, force: bool) -> None:
    for opt, force_opt in ((socket.SO_RCVBUF, 33), (socket.SO_SNDBUF, 32)):  # SO_RCVBUFFORCE, SO_SNDBUFFORCE
        try:
            sock.setsockopt(socket.SOL_SOCKET, force_opt if force else opt, SOCKET_BUFFER)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)


def open_udp(bind: tuple[str, int]) -> socket.socket:
    """The forwarder's UDP socket, bound in the current (the host's) network namespace."""
    family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(bind)
    except OSError as e:
        sock.close()
        raise TunnelError(f"cannot bind the tunnel's UDP socket to {bind[0]} port {bind[1]}: {e.strerror}") from None
    _buffers(sock, force=False)
    return sock


def connect_peer(sock: socket.socket, peer: tuple[str, int]) -> None:
    """Pin the peer: a connected UDP socket receives from that address and port only."""
    try:
        sock.connect(peer)
    except OSError as e:
        raise TunnelError(f"cannot reach the tunnel's peer {peer[0]} port {peer[1]}: {e.strerror}") from None


def enter(userns: str | None, netns: str | None) -> None:
    """Join a user namespace, then a network namespace (handles: /proc/PID/ns/... or bind
    mounts). Call while the process has one thread (joining a user namespace needs it)."""
    for path, flag in ((userns, CLONE_NEWUSER), (netns, CLONE_NEWNET)):
        if path is None:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise TunnelError(f"cannot open namespace {path}: {e.strerror}") from None
        try:
            if _libc.setns(fd, flag) != 0:
                err = ctypes.get_errno()
                raise TunnelError(f"cannot enter namespace {path}: {os.strerror(err)}")
        finally:
            os.close(fd)


def open_packet(ifname: str) -> tuple[socket.socket, bool]:
    """An AF_PACKET socket on ``ifname`` with virtio-net headers; also whether the kernel
    keeps our own sent frames from it (else the reader checks each frame's packet type)."""
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.htons(ETH_P_ALL))
    except OSError as e:
        raise TunnelError(f"cannot open a packet socket: {e.strerror}",) from None
    try:
        sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
        sock.bind((ifname, ETH_P_ALL))
    except OSError as e:
        sock.close()
        raise TunnelError(f"cannot bind a packet socket to {ifname}: {e.strerror}") from None
    try:
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        ignores = True
    except OSError:  # before Linux 4.20
        ignores = False
    _buffers(sock, force=True)
    return sock, ignores


# --------------------------------------------------------------------------- forwarding
class Forwarder:
    """Copies frames between a packet socket and a connected UDP socket, both ways, and
    watches the peer (keepalives when idle; nothing but a rare probe once it is silent)."""

    def __init__(self, udp: socket.socket, pkt: socket.socket, token: bytes, *, ignores_outgoing: bool = True,
                 max_payload: int | None = None, timing: Timing = Timing(), peer: str | None = None) -> None:
        self.udp, self.pkt = udp, pkt
        self.tx = wire.Sender(token)
        self.rx = wire.Receiver(token, self.tx.sender)
        self.ignores_outgoing = ignores_outgoing
        v6 = udp.family == socket.AF_INET6
        self.max_payload = min(max_payload or 65535, wire.UDP_MAX_PAYLOAD_V6 if v6 else wire.UDP_MAX_PAYLOAD_V4)
        wire.parts(1, self.max_payload)  # raises when the header does not fit
        self.watch = PeerWatch(peer or peer_words(udp), timing)
        self.counters = Counters()
        self.stopping = False
        self._stopped = threading.Event()
        self._number = 0
        """The last frame number used for a frame sent in parts."""
        self.threads: list[threading.Thread] = []

    def read_kernel_drops(self) -> None:
        """Add the packet socket's kernel drops since the last call (reading resets them)."""
        try:
            raw = self.pkt.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        except OSError:
            return
        self.counters.packet_socket_drops += int.from_bytes(raw[4:8], sys.byteorder)

    def start(self) -> None:
        """Forward both ways and watch the peer, one thread each, until :meth:`stop` (or the
        process ends)."""
        self.threads = [threading.Thread(target=self.to_peer, name="tunnel-out", daemon=True),
                        threading.Thread(target=self.from_peer, name="tunnel-in", daemon=True),
                        threading.Thread(target=self.keep_alive, name="tunnel-watch", daemon=True)]
        for t in self.threads:
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the threads (shutting the sockets down wakes them) and close the sockets."""
        self.stopping = True
        self._stopped.set()
        for sock in (self.udp, self.pkt):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # a packet socket cannot be: its reader ends at its next frame, or with the process
                pass
        for t in self.threads:
            t.join(timeout)
        self.udp.close()
        self.pkt.close()

    def keep_alive(self) -> None:
        """A keepalive when the link has been idle, a probe now and then to a silent peer."""
        while not self._stopped.wait(self.watch.timing.tick):
            if not self.watch.tick():
                continue
            try:
                self.udp.send(self.tx.keepalive())
            except OSError:  # the peer is not there (ECONNREFUSED), or our queue is full
                pass
            self.watch.sent()
            self.counters.keepalives_out += 1

    def _read_frame(self, buf: bytearray) -> int:
        """The next frame from the veth into ``buf`` (its length; 0: none to send)."""
        if self.ignores_outgoing:
            n = self.pkt.recv_into(buf, 0, socket.MSG_TRUNC)
        else:
            n, addr = self.pkt.recvfrom_into(buf, 0, socket.MSG_TRUNC)
            if addr[2] == PACKET_OUTGOING:
                return 0
        if n > len(buf):
            self.counters.dropped_out += 1
            return 0
        return n

    def _send(self, frame: memoryview) -> None:
        """One frame to the peer: whole, or in parts (OSError: not sent)."""
        c, tx = self.counters, self.tx
        if len(frame) <= self.max_payload - wire.OVERHEAD:
            head, tag = tx.seal(wire.WHOLE, frame)
            self.udp.sendmsg([head, frame, tag])
        else:
            self._number = (self._number + 1) & 0xFFFF
            pieces = list(tx.split(frame, self._number, self.max_payload))
            if not pieces:
                c.dropped_out += 1
                return
            for head, chunk, tag in pieces:
                self.udp.sendmsg([head, chunk, tag])
            c.split_out += 1
        c.frames_out += 1
        c.bytes_out += len(frame)

    def to_peer(self) -> None:
        """veth -> peer, until the sockets close; nothing while the peer is silent."""
        buf = bytearray(wire.MAX_FRAME)
        view = memoryview(buf)
        c, watch = self.counters, self.watch
        while True:
            try:
                n = self._read_frame(buf)
            except OSError:
                return
            if self.stopping:
                return
            if n == 0:
                continue
            if watch.silent:
                c.dropped_silent += 1
                continue
            try:
                self._send(view[:n])
            except OSError:  # the peer is not there yet (ECONNREFUSED), or our queue is full
                c.dropped_out += 1
                continue
            watch.sent()

    def _frame(self, view: memoryview, end: int, reasm: wire.Reassembler) -> memoryview | None:
        """The frame an opened datagram carries, or completes; None: not yet, dropped, or a keepalive."""
        tail = view[wire.TAIL_AT:wire.HEADER_BYTES]
        if tail == wire.WHOLE:
            return view[wire.HEADER_BYTES:end]
        if tail == wire.KEEPALIVE:
            self.counters.keepalives_in += 1
            return None
        before = reasm.dropped
        frame = reasm.add(view, end)
        self.counters.dropped_in += reasm.dropped - before
        return frame

    def _dropped(self, why: int) -> None:
        c = self.counters
        if why == wire.REPLAYED:
            c.replayed += 1
        elif why == wire.REFLECTED:
            c.reflected += 1
        else:
            c.rejected += 1

    def from_peer(self) -> None:
        """peer -> veth, until the sockets close."""
        buf = bytearray(65536)
        view = memoryview(buf)
        reasm = wire.Reassembler()
        rx, c, watch = self.rx, self.counters, self.watch
        while True:
            try:
                n = self.udp.recv_into(buf)
            except ConnectionRefusedError:  # an ICMP error for an earlier send: the peer was not there
                continue
            except OSError:
                return
            if self.stopping:
                return
            end = rx.open(view, n)
            if end < 0:
                self._dropped(end)
                continue
            watch.heard()
            frame = self._frame(view, end, reasm)
            if frame is None:
                continue
            try:
                self.pkt.send(frame)
            except OSError:  # a malformed vnet header, or the veth's queue is full
                c.dropped_in += 1
                continue
            c.frames_in += 1
            c.bytes_in += len(frame)


# --------------------------------------------------------------------------- the command
def _line(what: str) -> str:
    line = sys.stdin.buffer.readline(LINE_MAX)
    if not line.endswith(b"\n"):
        raise TunnelError(f"expected {what} as a line on stdin")
    return line.decode("ascii", "replace").strip()


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m testbed.net.tunnel", description=__doc__.split("\n\n")[0])
    p.add_argument("--ifname", required=True, help="the veth end to forward (in the namespace entered)")
    p.add_argument("--bind", required=True, type=wire.parse_hostport, help="ADDRESS:PORT for UDP (port 0: any)")
    p.add_argument("--peer", type=wire.parse_hostport, help="the peer forwarder's ADDRESS:PORT (else read on stdin)")
    p.add_argument("--netns", help="network namespace to enter after binding (a handle path)")
    p.add_argument("--userns", help="user namespace to enter first (a handle path)")
    p.add_argument("--max-payload", type=int, help="largest UDP payload to send (default: as large as UDP allows)")
    p.add_argument("--stdin-lifetime", action="store_true", help="exit when stdin closes")
    p.add_argument("--tunnel-id", help="a mark only this forwarder carries (testbed finds it again by it)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # the threads inherit it: only sigwait takes them
    try:
        token = wire.parse_token(_line("the link's token"))
        udp = open_udp(args.bind)
        host, port = udp.getsockname()[:2]
        _say(f"bound {host} {port}")
        connect_peer(udp, args.peer or wire.parse_peer(_line("the peer's address")))
        enter(args.userns, args.netns)
        pkt, ignores = open_packet(args.ifname)
        fwd = Forwarder(udp, pkt, token, ignores_outgoing=ignores, max_payload=args.max_payload)
    except (TunnelError, wire.WireError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    fwd.start()
    if args.stdin_lifetime:
        threading.Thread(target=_await_eof, daemon=True).start()
    _say("ready")
    signal.sigwait(_STOP_SIGNALS)
    fwd.read_kernel_drops()
    print(json.dumps(asdict(fwd.counters)), file=sys.stderr, flush=True)
    os._exit(0)  # the threads sit in recv; nothing else to release


def _await_eof() -> None:
    while os.read(sys.stdin.fileno(), LINE_MAX):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
