"""Joining a job: HELLO/WELCOME over UDP, learning the session id and peer addresses.

The aggregator (PS server, or rank 0 in sharded mode) picks a random 64-bit
session id unless one is given; members learn it from WELCOME, so a job's
datagrams are told apart from any other job's on the same port. The joining
handler stays installed for the whole job: a member whose WELCOME was lost
simply says HELLO again.
"""
from __future__ import annotations

import json
import secrets
import socket
import time

from . import wire
from .engine import Engine
from .framing import TcpControl
from .errors import TransportError
from .wire import MsgType


def new_session_id() -> int:
    return secrets.randbits(63) | 1


def _msg(type_, payload: dict, *, src: int, session: int) -> bytes:
    return wire.pack(type_, json.dumps(payload, separators=(",", ":")).encode(), src=src,
                     session=session)


class Rendezvous:
    """Aggregator side of joining: collect HELLOs from ranks 0..expected-1."""

    def __init__(self, eng: Engine, expected_ranks: list[int], welcome: dict, *,
                 want_tcp: bool, include_table: bool, listen: socket.socket | None):
        self.eng = eng
        self.expected = set(expected_ranks)
        self.welcome = dict(welcome)
        self.want_tcp = want_tcp
        self.include_table = include_table
        self.numel = welcome.get("numel")
        self.addrs: dict[int, tuple[str, int]] = {}
        self.listen = listen
        self.pending_conns: list[TcpControl] = []
        eng.join_handler = self.on_join
        if listen is not None:
            listen.setblocking(False)
            eng.sel.register(listen, 1, "listen")
            eng.tcp_accept_handler = self.accept

    def accept(self) -> None:
        try:
            sock, _ = self.listen.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn = TcpControl(sock)
        self.pending_conns.append(conn)
        self.eng.register_tcp(conn)

    def complete(self) -> bool:
        if set(self.addrs) != self.expected:
            return False
        return not self.want_tcp or all(r in self.eng.tcp for r in self.expected)

    def _welcome_payload(self, rank: int) -> dict:
        w = dict(self.welcome, numel=self.numel, rank=rank)
        if self.include_table:
            if not set(self.addrs) >= self.expected:
                return {}
            w["peers"] = {str(r): list(a) for r, a in self.addrs.items()}
        return w

    def on_join(self, h: wire.Header, payload: bytes, addr, tcp_peer) -> None:
        if h.type != MsgType.HELLO:
            self.eng.counters.foreign += 1
            return
        hello = json.loads(payload.decode())
        rank = int(hello["rank"])
        if rank not in self.expected:
            raise ValueError(f"rank {rank} not expected")
        if h.session and h.session != self.eng.session:
            self.eng.counters.foreign += 1
            return
        numel = int(hello["numel"])
        if self.numel is None:
            self.numel = numel
        elif numel != self.numel:
            raise ValueError("numel mismatch")
        conn = getattr(self.eng, "current_conn", None)
        if conn is not None:  # HELLO on a TCP control connection: bind it to the rank
            conn.peer = rank
            old = self.eng.tcp.get(rank)
            if old is not None and old is not conn:
                old.close()
            self.eng.tcp[rank] = conn
            return
        self.addrs[rank] = (addr[0], addr[1])
        self.eng.peers[rank] = (addr[0], addr[1])
        w = self._welcome_payload(rank)
        if w:
            if self.include_table:
                # everyone may have been waiting for the table: answer all
                for r, a in self.addrs.items():
                    if r == self.eng.rank:
                        continue
                    self.eng.send_raw(_msg(MsgType.WELCOME, self._welcome_payload(r),
                                           src=self.eng.rank, session=self.eng.session), a)
            else:
                self.eng.send_raw(_msg(MsgType.WELCOME, w, src=self.eng.rank,
                                       session=self.eng.session), addr)

    def run(self, timeout: float) -> None:
        missing = lambda: sorted(self.expected - set(self.addrs))  # noqa: E731
        self.eng.run_until(self.complete, time.monotonic() + timeout,
                           lambda: f"join: ranks {missing()} did not say HELLO within {timeout} s"
                           + (" (or did not open TCP control)" if self.want_tcp else ""))


def join_aggregator(eng: Engine, server_addr: tuple[str, int], server_rank: int, hello: dict,
                    timeout: float, session: int | None) -> dict:
    """Member side: HELLO every 20 ms until WELCOME; returns the WELCOME object."""
    eng.peers[server_rank] = server_addr
    got: dict = {}

    def on_join(h, payload, addr, tcp_peer):
        if h.type != MsgType.WELCOME or h.src != server_rank:
            eng.counters.foreign += 1
            return
        if session and h.session != session:
            eng.counters.foreign += 1
            return
        got.update(json.loads(payload.decode()), _session=h.session)

    eng.join_handler = on_join
    msg = _msg(MsgType.HELLO, hello, src=eng.rank, session=session or 0)
    deadline = time.monotonic() + timeout
    sent = 0
    while not got:
        if time.monotonic() >= deadline:
            raise TransportError(f"rank {eng.rank}: no WELCOME from the aggregator at "
                                 f"{server_addr[0]}:{server_addr[1]} within {timeout} s "
                                 "(is the server running? same session id?)")
        t_sent = time.monotonic()
        eng.send_raw(msg, server_addr)
        sent += 1
        eng.poll(0.02)
        if got and sent == 1:  # first HELLO answered: seed the RTT estimate
            eng.rtt_sample(server_rank, time.monotonic() - t_sent)
    return got
