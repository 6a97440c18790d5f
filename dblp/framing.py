"""TCP control framing: the optional control path of the paper (2-byte length + message).

A frame carries exactly what a UDP datagram would (header, payload, MAC
trailer), so one dispatcher (``Engine.handle``) serves both paths. Reading is
bounded: a declared frame length outside one message's possible sizes is a
protocol error that closes the connection, so a connection never buffers
more than one partial frame. Sending has a deadline (``SEND_TIMEOUT_S``): a
peer that stops reading cannot hold the sender in ``sendall`` for ever.
"""
from __future__ import annotations

import socket
import struct

from .errors import PeerClosed
from .wire import HEADER_SIZE, MAX_DATAGRAM, TAG_SIZE

_FRAME = struct.Struct("!H")
_MIN_FRAME = HEADER_SIZE + TAG_SIZE
#: Seconds one frame may take to leave: control frames are a few dozen bytes, so a peer
#: whose receive window stays shut this long has stopped reading (or never meant to).
SEND_TIMEOUT_S = 5.0


class TcpControl:
    """A TCP control connection, frames = 2-byte length + message.

    ``peer`` is the rank it belongs to, None until a HELLO binds it.
    ``nagle=False`` (the default) sets TCP_NODELAY: a control message is a
    few dozen bytes and must leave at once. ``nagle=True`` keeps Nagle's
    algorithm on, as the authors' prototype did (``TransportConfig.nagle``):
    a message written while an earlier one is unacknowledged waits for its
    ACK, which the peer may delay by up to its delayed-ACK timeout.

    ``nonce``: on the aggregator's side, the fresh value it sent this
    connection when it accepted it; only a HELLO carrying it, under the
    member's MAC, binds the connection (``dblp.join``), so a HELLO sniffed on
    one connection binds no other.
    """

    def __init__(self, sock: socket.socket, peer: int | None = None, *, nagle: bool = False):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0 if nagle else 1)
        # Blocking with a deadline: reads only happen when the selector says the socket is
        # readable, and a send gives up after SEND_TIMEOUT_S (socket.timeout, an OSError).
        sock.settimeout(SEND_TIMEOUT_S)
        self.sock = sock
        self.peer = peer
        self.nonce: int | None = None
        self.rx = bytearray()
        self.closed = False
        self.malformed = False  # closed for a frame no peer of ours would send

    def send(self, msg: bytes) -> None:
        try:
            self.sock.sendall(_FRAME.pack(len(msg)) + msg)
        except OSError as exc:
            self.closed = True
            raise PeerClosed(f"control connection to peer {self.peer} failed: {exc}") from exc

    def read_frames(self) -> list[bytes]:
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return []
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return []
        self.rx += data
        frames = []
        while len(self.rx) >= 2:
            (n,) = _FRAME.unpack_from(self.rx, 0)
            if not _MIN_FRAME <= n <= MAX_DATAGRAM:
                self.close()  # not our framing: nothing after this can be trusted
                self.malformed = True
                break
            if len(self.rx) < 2 + n:
                break
            frames.append(bytes(self.rx[2:2 + n]))
            del self.rx[:2 + n]
        return frames

    def close(self) -> None:
        self.closed = True
        self.rx.clear()
        try:
            self.sock.close()
        except OSError:
            pass


