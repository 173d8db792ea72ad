"""Whether a tunnel forwarder's peer is still there, and what the forwarder sends meanwhile.

A forwarder that exits frees its UDP port, and any local user may bind it; the surviving
forwarder's socket is connected to that port, so whatever it sends goes to the port's new
holder. The datagrams are authenticated (:mod:`testbed.net.tunnelauth`), so the holder can
neither forge nor replay one, but it would read the frames, which are not encrypted. So a
forwarder watches its peer (:class:`PeerWatch`):

- it sends a **keepalive** (a datagram without a frame) when it has sent nothing for
  :attr:`Timing.keepalive` seconds, so a live but idle link is heard on both sides;
- when nothing authentic has come from the peer for :attr:`Timing.silent` seconds, the peer
  is **silent**: the forwarder sends it no more frames and no keepalives, and says so in one
  line on its stderr (``warning: ...``);
- while the peer is silent it sends one keepalive every :attr:`Timing.probe` seconds, a
  **probe** without a frame or anything else to read, so that a link whose underlay was cut
  for longer than :attr:`Timing.silent` comes back when it heals (both ends would otherwise
  wait for the other for ever);
- an authentic datagram from the peer (a frame, a keepalive or a probe) ends the silence:
  sending resumes, and the forwarder says so in one line.

A forwarder that has just started counts as having heard its peer then, so a peer that starts
a little later (within :attr:`Timing.silent`) is not taken for a silent one; one that starts
later still is heard when it sends its first keepalive, which it does at once.
"""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import dataclass
from typing import Callable, TextIO

KEEPALIVE_S = 1.0
SILENT_S = 5.0
PROBE_S = 30.0
TICK_S = 0.25
"""How often the watch looks at the clocks (the silence is noticed at most this late)."""


@dataclass(frozen=True)
class Timing:
    """The watch's periods, in seconds."""

    keepalive: float = KEEPALIVE_S
    silent: float = SILENT_S
    probe: float = PROBE_S
    tick: float = TICK_S


class PeerWatch:
    """When the peer was last heard and this end last sent; whether the peer is silent.

    ``heard`` and ``sent`` are called by the forwarding threads for every datagram (a clock
    read and a store each); :meth:`tick`, from a thread of its own, decides what to send."""

    def __init__(self, who: str, timing: Timing = Timing(), log: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.who = who
        """The peer, in words (``127.0.0.1 port 4000``), for the warnings."""
        self.timing = timing
        self.log = log
        self.clock = clock
        now = clock()
        self.last_heard = now
        self.last_sent = now - timing.keepalive  # a keepalive at once: the peer hears we are up
        self.silent = False
        self.next_probe = 0.0
        self.silences = 0
        """How often the peer went silent."""

    def _say(self, text: str) -> None:
        print(text, file=self.log or sys.stderr, flush=True)

    def heard(self) -> None:
        """An authentic datagram came from the peer."""
        self.last_heard = self.clock()
        if self.silent:
            self.silent = False
            self._say(f"the tunnel's peer {self.who} is heard again: sending to it resumes")

    def sent(self) -> None:
        self.last_sent = self.clock()

    def tick(self) -> bool:
        """Look at the clocks: True when a keepalive (or a probe) is due now."""
        now = self.clock()
        t = self.timing
        if not self.silent and now - self.last_heard > t.silent:
            self.silent = True
            self.silences += 1
            self.next_probe = now + t.probe
            self._say(f"warning: nothing authentic from the tunnel's peer {self.who} for {t.silent:g} s: no "
                      f"longer sending to it (a probe without a frame every {t.probe:g} s until it is heard)")
            return False
        if self.silent:
            if now < self.next_probe:
                return False
            self.next_probe = now + t.probe
            return True
        return now - self.last_sent >= t.keepalive


def peer_words(udp: socket.socket) -> str:
    """A connected socket's peer in words (``ADDRESS port PORT``), for the warnings."""
    try:
        host, port = udp.getpeername()[:2]
    except OSError:
        return "(not connected)"
    return f"{host} port {port}"
