"""Joining a job: HELLO/WELCOME over UDP, learning the session id and peer addresses.

The aggregator (PS server, or rank 0 in sharded mode) picks a random 64-bit
session id unless one is given; members learn it from WELCOME, so a job's
datagrams are told apart from any other job's on the same port. The joining
handler stays installed for the whole job: a member whose WELCOME was lost
simply says HELLO again.

Who may join: with a job secret every HELLO carries a valid MAC (checked by
the engine before this module sees it), so nothing, not even the session id,
is told to a sender without the secret. A rank's address is pinned by its
first HELLO; another address may take the rank over only with the secret and
a fresh nonce (a replayed HELLO carries an old one). Without a secret the
pin is final. A TCP control connection is bound to a rank by a HELLO with
the nonce of that rank's current join, once per join: a replay cannot replace
the real connection. Payloads are parsed strictly (JSON objects of ints and
strings, nothing else); anything off is counted and dropped, never raised.
"""
from __future__ import annotations

import json
import logging
import secrets
import socket
import time
from typing import Any

from . import wire
from .engine import Engine
from .errors import TransportError
from .framing import TcpControl
from .wire import MsgType

log = logging.getLogger("dblp")

MAX_NONCES = 64  # joins remembered per rank (replay protection); older ones are forgotten


def new_session_id() -> int:
    return secrets.randbits(63) | 1


def new_nonce() -> int:
    """A fresh join nonce: tells this join of a rank apart from replays of earlier ones."""
    return secrets.randbits(62) | 1


def _msg(type_, payload: dict, *, src: int, session: int) -> bytes:
    """A join message body (header + JSON payload); the engine seals it when sending."""
    return wire.pack_body(type_, json.dumps(payload, separators=(",", ":")).encode(), src=src,
                          session=session)


class Refused(ValueError):
    """A join message that is not what an honest peer sends (counted, never raised further)."""


def _no_float(text: str):
    raise Refused(f"number {text!r} where only integers are allowed")


def parse_object(payload: bytes) -> dict:
    """A JSON object of a join message; Refused for anything else (depth, NaN, 1e999, ...)."""
    try:
        obj = json.loads(payload.decode("utf-8"), parse_float=_no_float, parse_constant=_no_float)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Refused(f"not a JSON object: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise Refused("not a JSON object")
    return obj


def get_int(obj: dict, key: str, lo: int, hi: int) -> int:
    v = obj.get(key)
    if type(v) is not int or not lo <= v <= hi:
        raise Refused(f"{key} must be an int in [{lo}, {hi}]")
    return v


def get_str(obj: dict, key: str, choices=None) -> str:
    v = obj.get(key)
    if not isinstance(v, str) or len(v) > 64 or (choices is not None and v not in choices):
        raise Refused(f"{key} must be a short string")
    return v


MAX_NUMEL = 1 << 40


def parse_hello(payload: bytes) -> tuple[int, int, int]:
    """(rank, numel, nonce) of a HELLO."""
    obj = parse_object(payload)
    return (get_int(obj, "rank", 0, 65534), get_int(obj, "numel", 1, MAX_NUMEL),
            get_int(obj, "nonce", 1, 2**62))


def welcome_extras(chunk_bytes: int) -> dict:
    """WELCOME fields an aggregator adds only off the defaults (default bytes stay as they were).

    ``chunk_bytes``: a member cut with another size would fail every chunk
    as malformed and time out; the WELCOME lets it refuse at once instead.
    """
    return {} if chunk_bytes == wire.CHUNK_BYTES else {"chunk_bytes": chunk_bytes}


def parse_welcome(payload: bytes, rank: int) -> dict:
    """The fields of a WELCOME this member relies on, typed and range-checked."""
    obj = parse_object(payload)
    w: dict[str, Any] = {"session": get_int(obj, "session", 1, 2**64 - 1),
         "numel": get_int(obj, "numel", 1, MAX_NUMEL),
         "world_size": get_int(obj, "world_size", 1, 65534),
         "mode": get_str(obj, "mode"), "policy": get_str(obj, "policy"),
         "bound_ppm": get_int(obj, "bound_ppm", 0, wire.PPM - 1)}
    if get_int(obj, "rank", 0, 65534) != rank:
        raise Refused("WELCOME for another rank")
    if "phase" in obj:
        w["phase"] = get_str(obj, "phase")
    w["chunk_bytes"] = (get_int(obj, "chunk_bytes", 4, wire.MAX_CHUNK_BYTES)
                        if "chunk_bytes" in obj else wire.CHUNK_BYTES)
    if "peers" in obj:
        table = obj["peers"]
        world: int = w["world_size"]
        if not isinstance(table, dict) or len(table) > world:
            raise Refused("peers must be a table of at most world_size entries")
        peers = {}
        for r, a in table.items():
            if not (isinstance(r, str) and r.isdigit() and int(r) < world
                    and isinstance(a, list) and len(a) == 2 and isinstance(a[0], str)
                    and type(a[1]) is int and 0 < a[1] < 65536):
                raise Refused("peers entry is not rank -> [ipv4, port]")
            try:
                socket.inet_aton(a[0])
            except OSError:
                raise Refused("peers entry has no IPv4 address") from None
            peers[int(r)] = (a[0], a[1])
        w["peers"] = peers
    return w


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
        self.nonces: dict[int, list[int]] = {}  # per rank: nonces of its joins, newest last
        self.tcp_nonce: dict[int, int] = {}  # per rank: the join whose nonce bound its TCP conn
        self.listen = listen
        eng.joining.handler = self.on_join
        if listen is not None:
            listen.setblocking(False)
            eng.sel.register(listen, 1, "listen")
            eng.joining.accept_handler = self.accept

    def accept(self) -> None:
        """Accept what the backlog holds (a full backlog drops the SYNs of real members)."""
        if self.listen is None:
            return
        for _ in range(64):
            try:
                sock, _ = self.listen.accept()
            except OSError:  # BlockingIOError, or a connection reset before we got to it
                return
            try:
                conn = TcpControl(sock, nagle=self.eng.nagle)
            except OSError:  # reset between accept and setsockopt
                sock.close()
                continue
            self.eng.register_tcp(conn, max_unbound=len(self.expected) + 8)

    def complete(self) -> bool:
        if set(self.addrs) != self.expected:
            return False
        return not self.want_tcp or all(r in self.eng.peers.tcp for r in self.expected)

    def _welcome_payload(self, rank: int) -> dict:
        w = dict(self.welcome, numel=self.numel, rank=rank)
        if self.include_table:
            if not set(self.addrs) >= self.expected:
                return {}
            w["peers"] = {str(r): list(a) for r, a in self.addrs.items()}
        return w

    def on_join(self, h: wire.Header, payload: bytes, addr, tcp_peer) -> None:
        """Handle one HELLO (already authenticated when the job has a secret); never raises."""
        eng = self.eng
        if h.type != MsgType.HELLO or (h.session and h.session != eng.session):
            eng.counters.foreign += 1
            return
        try:
            rank, numel, nonce = parse_hello(payload)
        except Refused:
            eng.counters.malformed += 1
            return
        if rank not in self.expected or rank == eng.rank or h.src != rank \
                or (self.numel is not None and numel != self.numel):
            eng.counters.foreign += 1
            return
        conn = eng.joining.current_conn
        if conn is not None:
            self._bind_tcp(conn, rank, nonce)
            return
        if addr is None:
            eng.counters.foreign += 1
            return
        addr = (addr[0], addr[1])
        seen = self.nonces.setdefault(rank, [])
        pinned = self.addrs.get(rank)
        if pinned is not None and pinned != addr:
            # A new address for a joined rank: a re-join with the secret, or an attack.
            if eng.sealer.key is None or nonce in seen:
                eng.counters.foreign += 1
                return
        if nonce not in seen:
            seen.append(nonce)
            del seen[:-MAX_NONCES]
        if self.numel is None:
            self.numel = numel
        self.addrs[rank] = addr
        eng.peers.addrs[rank] = addr
        w = self._welcome_payload(rank)
        if not w:
            return
        if self.include_table:
            # everyone may have been waiting for the table: answer all
            for r, a in self.addrs.items():
                if r != eng.rank:
                    eng.send_raw(_msg(MsgType.WELCOME, self._welcome_payload(r), src=eng.rank,
                                      session=eng.session), a)
        else:
            eng.send_raw(_msg(MsgType.WELCOME, w, src=eng.rank, session=eng.session), addr)

    def _bind_tcp(self, conn: TcpControl, rank: int, nonce: int) -> None:
        """Bind a TCP control connection to ``rank``: once per join, never by a replay."""
        eng = self.eng
        seen = self.nonces.get(rank)
        if not seen or nonce != seen[-1] or self.tcp_nonce.get(rank) == nonce:
            eng.counters.foreign += 1  # no UDP join yet, an old join, or a replay
            return
        old = eng.peers.tcp.get(rank)
        if eng.sealer.key is None:
            # No secret: the connection must come from the rank's pinned host, and the
            # first one stays (nothing could tell a legitimate replacement apart).
            try:
                host = conn.sock.getpeername()[0]
            except OSError:
                host = None
            if host != self.addrs[rank][0] or (old is not None and not old.closed):
                eng.counters.foreign += 1
                return
        conn.peer = rank
        self.tcp_nonce[rank] = nonce
        if old is not None and old is not conn:
            old.close()
        eng.peers.tcp[rank] = conn
        eng.peers.closed.discard(rank)

    def run(self, timeout: float) -> None:
        def missing() -> list[int]:
            return sorted(self.expected - set(self.addrs))
        self.eng.run_until(self.complete, time.monotonic() + timeout,
                           lambda: f"join: ranks {missing()} did not say HELLO within {timeout} s"
                           + (" (or did not open TCP control)" if self.want_tcp else ""))


def join_aggregator(eng: Engine, server_addr: tuple[str, int], server_rank: int, hello: dict,
                    timeout: float, session: int | None, *, quiet_after: float | None = None,
                    hint: str = "is the server running? same session id and secret?") -> dict:
    """Member side: HELLO every 20 ms until WELCOME; returns ``parse_welcome``'s dict.

    ``hello`` must hold ``rank``, ``numel`` and ``nonce``. A WELCOME counts only
    from the aggregator's rank (and, without a secret, its address) and for
    our session when we know it. The aggregator may legitimately start later
    than its members, so silence is an error only after ``timeout``; but after
    ``quiet_after`` seconds of it the member says so once (logger ``dblp``,
    WARNING) naming the address it is trying, so a missing aggregator is not
    a silent two-minute hang. ``hint`` says what to check.
    """
    eng.peers.addrs[server_rank] = server_addr
    got: dict = {}

    def on_join(h, payload, addr, tcp_peer):
        if h.type != MsgType.WELCOME or h.src != server_rank or (session and h.session != session) \
                or (eng.sealer.key is None and addr is not None
                    and (addr[0], addr[1]) != server_addr):
            eng.counters.foreign += 1
            return
        try:
            w = parse_welcome(payload, eng.rank)
        except Refused:
            eng.counters.malformed += 1
            return
        if w["session"] != h.session:
            eng.counters.malformed += 1
            return
        got.update(w)

    eng.joining.handler = on_join
    msg = _msg(MsgType.HELLO, hello, src=eng.rank, session=session or 0)
    t_start = time.monotonic()
    deadline = t_start + timeout
    where = f"{server_addr[0]}:{server_addr[1]}"
    warned = quiet_after is None or quiet_after >= timeout
    sent = 0
    while not got:
        now = time.monotonic()
        if now >= deadline:
            raise TransportError(f"rank {eng.rank}: no WELCOME from the aggregator at {where} "
                                 f"(UDP) within {timeout} s ({hint})")
        if not warned and quiet_after is not None and now - t_start >= quiet_after:
            warned = True
            log.warning("rank %d: no answer from the aggregator at %s (UDP) after %.0f s; "
                        "still trying until join_timeout=%s s (%s)", eng.rank, where,
                        now - t_start, timeout, hint)
        t_sent = time.monotonic()
        eng.send_raw(msg, server_addr)
        sent += 1
        eng.poll(0.02)
        if got and sent == 1:  # first HELLO answered: seed the RTT estimate
            eng.peers.rtt_sample(server_rank, time.monotonic() - t_sent)
    return got
