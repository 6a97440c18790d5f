"""Joining a job: HELLO -> CHALLENGE -> HELLO with the answer -> WELCOME, over UDP.

The aggregator (PS server, or rank 0 in sharded mode) uses the session id a
launcher gives it (``TransportConfig.session_id``: the harness draws one per
run) or draws a fresh random 64-bit one; members learn it from WELCOME, and
every message after the join carries it under the MAC, so a job's datagrams
are told apart from any other job's on the same port. The joining handler
stays installed for the whole job: a member whose WELCOME was lost simply
says HELLO again.

Why a challenge: a HELLO, even authenticated, can be a replay (of this
job's, or of an earlier job's that used the same secret), sent from any
address. So no HELLO pins or moves a rank's address by itself. The
aggregator answers a HELLO with a CHALLENGE to the address it came from: the
member's fresh nonce echoed and a value only this aggregator can make, a MAC
under a key it draws (a new one every ``Cookies.EPOCH_S``) over that
address, the rank and the nonce (a stateless cookie, as DTLS and WireGuard
use). Only a member at that address that holds the secret can send the HELLO
that carries the answer; that HELLO pins the rank to the address (or, once
joined, moves it there), and the WELCOME echoes the member's nonce, so a
member never adopts the session of a WELCOME sent to an earlier join. The
same answered HELLO again (a lost WELCOME, or a replay) changes nothing and
is answered to that rank alone, at most every ``WELCOME_REPEAT_S``. A launcher-set session must be in every
HELLO (a HELLO of another job is refused at once). A TCP control connection
is bound to a rank only by a HELLO marked TCP (``Flag.TCP``, under the MAC:
a UDP HELLO cannot pass for one) that carries the job's session, the nonce
of the rank's current join and the fresh value the aggregator sent that
very connection when it accepted it (``TcpControl.nonce``): a HELLO sniffed
on one connection binds no other, so it cannot take a rank's control
messages. The aggregator confirms a binding with a frame sealed for the
rank; a member whose connection is closed before that (unbound connections
are capped, so a burst of connects evicts the oldest) connects again until
its join timeout (``bind_control``).

Without a secret nothing proves who speaks: the challenge still proves the
address (an off-path sender cannot answer it), and the first pin is final.

A wrong secret is named, but only where nothing unauthenticated can be
made to act on it (WireGuard's and QUIC's rule: an unauthenticated message is
dropped and never acted on). An aggregator answers a HELLO whose tag fails
with a refusal (rate-limited, never larger than the HELLO, within the
engine's global budget for failed tags); a member that hears its
aggregator's address only in tags that fail says so once (logger ``dblp``,
WARNING) and keeps trying: one forged CHALLENGE from that address used to
abort a join a second later. Either side names the failed tags, as
context, in its join timeout's error (the secrets differ, unless someone
forged them), never what the secrets are, and never blames an address for
them otherwise.
Payloads are parsed strictly (JSON objects of ints and strings, nothing
else); anything off is counted and dropped, never raised.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from . import wire
from .engine import Engine
from .errors import PeerClosed, TransportError
from .framing import SEND_TIMEOUT_S, TcpControl
from .wire import Flag, MsgType

log = logging.getLogger("dblp")

MAX_NONCES = 64  # joins remembered per rank (replay protection); older ones are forgotten
#: Refusals (answers to HELLOs whose tags fail) an aggregator sends per second, at most.
REFUSALS_PER_S = 20
#: Least time between two WELCOMEs to one rank for the same join (its answered HELLO
#: repeated: a lost WELCOME, or a replay); a member repeats its HELLO every 20 ms.
WELCOME_REPEAT_S = 0.05


def new_session_id() -> int:
    return secrets.randbits(63) | 1


def new_nonce() -> int:
    """A fresh join nonce: tells this join of a rank apart from replays of earlier ones."""
    return secrets.randbits(62) | 1


def _json(payload: dict) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _msg(type_, payload: dict, *, src: int, session: int, flags: int = 0) -> bytes:
    """A join message body (header + JSON payload); the engine seals it when sending."""
    return wire.pack_body(type_, _json(payload), src=src, session=session, flags=flags)


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


def parse_hello(payload: bytes) -> tuple[int, int, int, int | None]:
    """(rank, numel, nonce, answer to the challenge or None) of a HELLO."""
    obj = parse_object(payload)
    answer = get_int(obj, "answer", 1, 2**62) if "answer" in obj else None
    return (get_int(obj, "rank", 0, 65534), get_int(obj, "numel", 1, MAX_NUMEL),
            get_int(obj, "nonce", 1, 2**62), answer)


def parse_challenge(payload: bytes, rank: int, nonce: int) -> int | None:
    """The challenge of a CHALLENGE for this join of ``rank``; None for a refusal."""
    obj = parse_object(payload)
    if "refused" in obj:
        get_str(obj, "refused")
        return None
    if get_int(obj, "rank", 0, 65534) != rank or get_int(obj, "nonce", 1, 2**62) != nonce:
        raise Refused("CHALLENGE for another join")
    return get_int(obj, "challenge", 1, 2**62)


_COOKIE = struct.Struct("!QHQ")


class Cookies:
    """The aggregator's challenges: a MAC under a key it draws, so none is stored.

    A challenge is bound to the address it was sent to, the rank and the
    member's nonce (and, through the key, to this aggregator process): an
    answer from any other address, or to an earlier aggregator, is refused.
    The key has epochs, as WireGuard's cookie secret does: a new one every
    ``EPOCH_S`` seconds, the one before still accepted (a challenge sent just
    before the change is answered after it), so an answer is good for at most
    two epochs, not for the aggregator's whole life.
    """

    __slots__ = ("_macs", "_since", "_clock")

    EPOCH_S = 120.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._macs = [self._new_key()]
        self._since = clock()

    @staticmethod
    def _new_key():
        return hashlib.blake2b(key=secrets.token_bytes(32), digest_size=8)

    def _epoch(self) -> None:
        now = self._clock()
        if now - self._since >= self.EPOCH_S:
            self._macs = [self._new_key(), self._macs[0]]
            self._since = now

    @staticmethod
    def _value(mac, addr: tuple[str, int], rank: int, nonce: int) -> int:
        m = mac.copy()
        m.update(socket.inet_aton(addr[0]) + _COOKIE.pack(addr[1], rank, nonce))
        return int.from_bytes(m.digest(), "big") & (2**62 - 1) | 1

    def make(self, addr: tuple[str, int], rank: int, nonce: int) -> int:
        """The challenge for a HELLO of ``rank`` with ``nonce`` from ``addr``, this epoch."""
        self._epoch()
        return self._value(self._macs[0], addr, rank, nonce)

    def check(self, answer: int, addr: tuple[str, int], rank: int, nonce: int) -> bool:
        """Whether ``answer`` is a challenge of this epoch or the one before for them."""
        self._epoch()
        return any(answer == self._value(mac, addr, rank, nonce) for mac in self._macs)


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
    w["nonce"] = get_int(obj, "nonce", 1, 2**62)
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
    """Aggregator side of joining: collect HELLOs from ranks 0..expected-1.

    ``require_session``: the session was set by the launcher, so a HELLO must
    carry it (members know it before they join); else a HELLO may carry 0.
    """

    def __init__(self, eng: Engine, expected_ranks: list[int], welcome: dict, *,
                 want_tcp: bool, include_table: bool, listen: socket.socket | None,
                 require_session: bool = False):
        self.eng = eng
        self.expected = set(expected_ranks)
        self.welcome = dict(welcome)
        self.want_tcp = want_tcp
        self.include_table = include_table
        self.require_session = require_session
        self.numel = welcome.get("numel")
        self.addrs: dict[int, tuple[str, int]] = {}
        self.nonces: dict[int, list[int]] = {}  # per rank: nonces of its joins, newest last
        self.pin_nonce: dict[int, int] = {}  # per rank: the nonce of the join that pinned it
        self.tcp_nonce: dict[int, int] = {}  # per rank: the join whose nonce bound its TCP conn
        self.cookies = Cookies()
        self.bad_hellos: set[tuple[str, int]] = set()  # sources of HELLOs whose tags failed
        self._refusals = [0.0, 0]  # [second, refusals sent in it]
        self._welcomed: dict[int, float] = {}  # per rank: when its WELCOME last left
        self.listen = listen
        eng.joining.handler = self.on_join
        eng.joining.on_bad_tag = self.on_bad_tag
        eng.joining.admit = self.admit
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
                # A fresh value for this connection alone, which its HELLO must carry under
                # the member's MAC. Unauthenticated itself: it only has to be new.
                conn.nonce = new_nonce()
                conn.send(wire.pack(MsgType.CHALLENGE, _json({"conn": conn.nonce}),
                                    src=self.eng.rank, session=self.eng.session))
            except (OSError, PeerClosed):  # reset between accept and now
                sock.close()
                continue
            self.eng.register_tcp(conn, max_unbound=len(self.expected) + 8)

    def complete(self) -> bool:
        if set(self.addrs) != self.expected:
            return False
        return not self.want_tcp or all(r in self.eng.peers.tcp for r in self.expected)

    def _welcome_payload(self, rank: int) -> dict:
        w = dict(self.welcome, numel=self.numel, rank=rank, nonce=self.pin_nonce[rank])
        if self.include_table:
            if not set(self.addrs) >= self.expected:
                return {}
            w["peers"] = {str(r): list(a) for r, a in self.addrs.items()}
        return w

    def admit(self, type_: int, src: int, session: int) -> bool:
        """Whether a join message is worth a MAC: a HELLO claiming an expected rank (not ours)
        with this job's session, or none where the launcher did not set one."""
        return type_ == MsgType.HELLO and src in self.expected and src != self.eng.rank \
            and (session == self.eng.session or (session == 0 and not self.require_session))

    def on_bad_tag(self, buf, n: int, addr, now: float) -> None:
        """A message whose tag failed: if it is a HELLO, refuse it (so its sender learns that the
        secrets differ), at most ``REFUSALS_PER_S`` a second and never larger than the HELLO."""
        eng = self.eng
        if addr is None or n < wire.HEADER_SIZE + wire.TAG_SIZE:
            return
        try:
            h = wire.unpack_header(buf, n, eng.chunk_bytes)
        except wire.MalformedDatagram:
            return
        if h.type != MsgType.HELLO or h.src not in self.expected:
            return
        sec = int(now)
        if self._refusals[0] != sec:
            self._refusals = [sec, 0]
        if self._refusals[1] >= REFUSALS_PER_S:
            return
        self._refusals[1] += 1
        addr = (addr[0], addr[1])
        if addr not in self.bad_hellos:
            log.warning("rank %d: a HELLO for rank %d from %s:%d failed authentication: a "
                        "process with another secret (or none), or a forgery", eng.rank, h.src,
                        *addr)
            if len(self.bad_hellos) < 64:
                self.bad_hellos.add(addr)
        refusal = _msg(MsgType.CHALLENGE, {"refused": "tag"}, src=eng.rank, session=0)
        if len(refusal) + wire.TAG_SIZE <= n:  # never an amplifier (a real HELLO is longer)
            eng.send_raw(refusal, addr, h.src)

    def on_join(self, h: wire.Header, payload: bytes, addr, tcp_peer) -> None:
        """Handle one HELLO (already authenticated when the job has a secret); never raises."""
        eng = self.eng
        if h.type != MsgType.HELLO or (h.session and h.session != eng.session) \
                or (self.require_session and h.session != eng.session):
            eng.counters.foreign += 1
            return
        try:
            rank, numel, nonce, answer = parse_hello(payload)
        except Refused:
            eng.counters.malformed += 1
            return
        if rank not in self.expected or rank == eng.rank or h.src != rank \
                or (self.numel is not None and numel != self.numel):
            eng.counters.foreign += 1
            return
        conn = eng.joining.current_conn
        if conn is not None:
            try:
                conn_nonce = get_int(parse_object(payload), "conn", 1, 2**62)
            except Refused:
                eng.counters.foreign += 1  # no connection nonce: not a TCP HELLO of ours
                return
            self._bind_tcp(conn, h, rank, nonce, conn_nonce)
            return
        if addr is None or h.flags & Flag.TCP:
            eng.counters.foreign += 1  # a TCP HELLO belongs on its connection
            return
        addr = (addr[0], addr[1])
        eng.bad.trust(addr)  # a candidate address of the rank: never blocked
        if answer is not None and not self.cookies.check(answer, addr, rank, nonce):
            # Answered from another address, to another aggregator, or epochs ago: no proof,
            # but a member whose answer aged out needs a new challenge to go on.
            eng.counters.foreign += 1
            answer = None
        if answer is None:
            # Not yet proof of anything (it may be a replay): challenge the address it came from.
            cookie = self.cookies.make(addr, rank, nonce)
            eng.send_raw(_msg(MsgType.CHALLENGE, {"rank": rank, "nonce": nonce,
                                                  "challenge": cookie},
                              src=eng.rank, session=eng.session), addr, rank)
            return
        seen = self.nonces.setdefault(rank, [])
        pinned = self.addrs.get(rank)
        if pinned is not None and pinned != addr:
            # A joined rank at a new address, proved there: a re-join with the secret (and a
            # nonce never used before: an old join's answer replayed from where it was is not).
            if eng.sealer.key is None or nonce in seen:
                eng.counters.foreign += 1
                return
        if pinned == addr and self.pin_nonce.get(rank) == nonce:
            # The same join again: the member's WELCOME was lost, or someone replays its
            # answered HELLO. Nothing changes; the rank alone is answered, at most once
            # every WELCOME_REPEAT_S (a replay cannot make rank 0 re-send the table to all).
            self._welcome_again(rank, addr)
            return
        if nonce not in seen:
            seen.append(nonce)
            del seen[:-MAX_NONCES]
        if self.numel is None:
            self.numel = numel
        self.addrs[rank] = addr
        self.pin_nonce[rank] = nonce
        eng.peers.addrs[rank] = addr
        eng.bad.forgive(addr)
        eng.refilter()  # the kernel lets the new member's datagrams through before it answers
        w = self._welcome_payload(rank)
        if not w:
            return
        self._welcomed[rank] = time.monotonic()
        if self.include_table:
            # everyone may have been waiting for the table: answer all
            for r, a in self.addrs.items():
                if r != eng.rank:
                    eng.send_raw(_msg(MsgType.WELCOME, self._welcome_payload(r), src=eng.rank,
                                      session=eng.session), a, r)
        else:
            eng.send_raw(_msg(MsgType.WELCOME, w, src=eng.rank, session=eng.session), addr, rank)

    def _welcome_again(self, rank: int, addr: tuple[str, int]) -> None:
        now = time.monotonic()
        if now - self._welcomed.get(rank, -math.inf) < WELCOME_REPEAT_S:
            self.eng.counters.duplicates += 1
            return
        w = self._welcome_payload(rank)
        if w:
            self._welcomed[rank] = now
            self.eng.send_raw(_msg(MsgType.WELCOME, w, src=self.eng.rank,
                                   session=self.eng.session), addr, rank)

    def _bind_tcp(self, conn: TcpControl, h: wire.Header, rank: int, nonce: int,
                  conn_nonce: int) -> None:
        """Bind a TCP control connection to ``rank``, never by a replay, and confirm it.

        Only a HELLO marked TCP that carries the job's session, the nonce of the
        rank's current join and this connection's own nonce does: a UDP HELLO
        (sniffed before the session was known, or after) cannot, being unmarked
        under the MAC, and a TCP HELLO sniffed on another connection carries
        that connection's nonce. With a secret, a rank's new connection so
        proved replaces its old one (the member connected again); without
        one, the first connection of a join stays.
        """
        eng = self.eng
        keyed = eng.sealer.key is not None
        if h.session != eng.session or not h.flags & Flag.TCP or conn_nonce != conn.nonce \
                or nonce != self.pin_nonce.get(rank) \
                or (not keyed and self.tcp_nonce.get(rank) == nonce):
            eng.counters.foreign += 1  # no UDP join yet, an old join, a UDP HELLO, or a replay
            return
        old = eng.peers.tcp.get(rank)
        if not keyed:
            # No secret: the connection must come from the rank's pinned host, and the
            # first one stays (nothing could tell a legitimate replacement apart).
            try:
                host = conn.sock.getpeername()[0]
            except OSError:
                host = None
            if host != self.addrs[rank][0] or (old is not None and not old.closed):
                eng.counters.foreign += 1
                return
        try:
            conn.send(eng.sealer.seal(_msg(MsgType.WELCOME, {"conn": conn_nonce}, src=eng.rank,
                                           session=eng.session), rank))
        except PeerClosed:
            return  # gone already: the member connects again
        conn.peer = rank
        self.tcp_nonce[rank] = nonce
        if old is not None and old is not conn:
            old.close()
        eng.peers.tcp[rank] = conn
        eng.peers.closed.discard(rank)

    def run(self, timeout: float) -> None:
        def missing() -> list[int]:
            return sorted(self.expected - set(self.addrs))

        def describe() -> str:
            text = f"join: ranks {missing()} did not say HELLO within {timeout} s" \
                + (" (or did not open TCP control)" if self.want_tcp else "")
            if self.bad_hellos:
                # Context, not a verdict: anyone can send a bad tag from any address.
                where = ", ".join(f"{a}:{p}" for a, p in sorted(self.bad_hellos))
                text += (f"; HELLOs from {where} failed authentication (unauthenticated, so "
                         "possibly forged): if those are the missing ranks, the secrets differ")
            return text
        self.eng.run_until(self.complete, time.monotonic() + timeout, describe)


def join_aggregator(eng: Engine, server_addr: tuple[str, int], server_rank: int, hello: dict,
                    timeout: float, session: int | None, *, quiet_after: float | None = None,
                    hint: str = "is the server running? same session id and secret?") -> dict:
    """Member side: HELLO every 20 ms until WELCOME; returns ``parse_welcome``'s dict.

    ``hello`` must hold ``rank``, ``numel`` and ``nonce``; a CHALLENGE that echoes
    the nonce adds its ``answer``, which every later HELLO carries. A CHALLENGE
    or WELCOME counts only from the aggregator's rank (and, without a secret,
    its address), for this join's nonce and for our session when we know it.
    The aggregator may legitimately start later than its members, so silence
    is an error only after ``timeout``; but after ``quiet_after`` seconds of it
    the member says so once (logger ``dblp``, WARNING) naming the address it
    is trying, so a missing aggregator is not a silent two-minute hang.
    ``hint`` says what to check. An aggregator's address heard only in tags that
    fail (or refusing ours) is probably another secret, but a forger can send
    those too: the member warns once and keeps trying, and its timeout's
    error names it as context; an authentic CHALLENGE or WELCOME rules it out.
    """
    eng.peers.addrs[server_rank] = server_addr
    eng.refilter()
    got: dict = {}
    hello = dict(hello)
    nonce = hello["nonce"]
    where = f"{server_addr[0]}:{server_addr[1]}"
    suspect: list[str] = []  # why the secrets may differ, from unauthenticated evidence
    authentic: list[bool] = []  # [True] once an authentic answer came: the secrets match
    keyed = eng.sealer.key is not None
    first_sent: list[float] = []  # when the first HELLO left (its CHALLENGE seeds the RTT)

    def send_hello() -> None:
        eng.send_raw(_msg(MsgType.HELLO, hello, src=eng.rank, session=session or 0),
                     server_addr, server_rank)

    def admit(type_: int, src: int, hdr_session: int) -> bool:
        return type_ != MsgType.HELLO and src == server_rank \
            and (not session or hdr_session in (0, session))

    def suspect_secrets(why: str) -> None:
        if suspect or authentic:
            return
        suspect.append(why)
        log.warning("rank %d: messages from the aggregator's address %s fail authentication: "
                    "%s, or they are forged; still trying until join_timeout=%s s",
                    eng.rank, where, why, timeout)

    def on_join(h, payload, addr, tcp_peer):
        if h.type not in (MsgType.WELCOME, MsgType.CHALLENGE) or h.src != server_rank \
                or (session and h.type == MsgType.WELCOME and h.session != session) \
                or (not keyed and addr is not None and (addr[0], addr[1]) != server_addr):
            eng.counters.foreign += 1
            return
        try:
            if h.type == MsgType.CHALLENGE:
                challenge = parse_challenge(payload, eng.rank, nonce)
                if challenge is None:
                    if keyed:  # a keyed member's HELLOs verify; a refusal for it is a replay
                        eng.counters.foreign += 1
                    else:
                        suspect_secrets("the aggregator has a secret and this rank has none")
                    return
                if keyed:
                    authentic[:] = [True]
                    suspect.clear()
                if hello.get("answer") != challenge:
                    if "answer" not in hello and len(first_sent) == 1:  # an unambiguous sample
                        eng.peers.rtt_sample(server_rank, time.monotonic() - first_sent[0])
                    hello["answer"] = challenge
                    send_hello()
                return
            w = parse_welcome(payload, eng.rank)
        except Refused:
            eng.counters.malformed += 1
            return
        if w["session"] != h.session or w["nonce"] != nonce:
            eng.counters.foreign += 1  # a WELCOME for another join (an earlier one, replayed)
            return
        got.update(w)

    def on_bad_tag(buf, n, addr, now):
        if addr is None or (addr[0], addr[1]) != server_addr or suspect or authentic:
            return
        try:
            h = wire.unpack_header(buf, n, eng.chunk_bytes)
        except wire.MalformedDatagram:
            return
        if h.type in (MsgType.CHALLENGE, MsgType.WELCOME) and h.src == server_rank:
            zero = bytes(buf[n - wire.TAG_SIZE:n]) == wire.ZERO_TAG
            suspect_secrets("the aggregator has no secret and this rank has one" if zero
                            else "the secret differs between this rank and the aggregator")

    eng.joining.handler = on_join
    eng.joining.on_bad_tag = on_bad_tag
    eng.joining.admit = admit
    t_start = time.monotonic()
    deadline = t_start + timeout
    warned = quiet_after is None or quiet_after >= timeout
    try:
        while not got:
            now = time.monotonic()
            if now >= deadline:
                if suspect:
                    raise TransportError(
                        f"rank {eng.rank}: no WELCOME from the aggregator at {where} (UDP) "
                        f"within {timeout} s, and its address was heard only in messages that "
                        f"failed authentication: {suspect[0]}, unless they were forged (give "
                        "every rank the same DBLP_SECRET / transport config secret)")
                raise TransportError(f"rank {eng.rank}: no WELCOME from the aggregator at "
                                     f"{where} (UDP) within {timeout} s ({hint})")
            if not warned and quiet_after is not None and now - t_start >= quiet_after:
                warned = True
                log.warning("rank %d: no answer from the aggregator at %s (UDP) after %.0f s; "
                            "still trying until join_timeout=%s s (%s)", eng.rank, where,
                            now - t_start, timeout, hint)
            if len(first_sent) < 2:
                first_sent.append(time.monotonic())
            send_hello()
            eng.poll(0.02)
    finally:
        eng.joining.on_bad_tag = None
        eng.joining.admit = None  # joined (or given up): join messages now cost no MAC
    return got


def _read_frame(conn: TcpControl, deadline: float) -> bytes | None:
    """The next frame of ``conn`` by ``deadline`` (later frames stay buffered); None if the
    connection closed or the time ran out."""
    while True:
        frames = _split_frame(conn)
        if frames is not None:
            return frames
        left = deadline - time.monotonic()
        if left <= 0 or conn.closed:
            return None
        try:
            conn.sock.settimeout(left)
            data = conn.sock.recv(65536)
        except OSError:
            data = b""
        finally:
            if not conn.closed:
                conn.sock.settimeout(SEND_TIMEOUT_S)
        if not data:
            conn.close()
            return None
        conn.rx += data


def _split_frame(conn: TcpControl) -> bytes | None:
    if len(conn.rx) < 2:
        return None
    n = int.from_bytes(conn.rx[:2], "big")
    if not wire.HEADER_SIZE + wire.TAG_SIZE <= n <= wire.MAX_DATAGRAM:
        conn.close()
        return None
    if len(conn.rx) < 2 + n:
        return None
    frame = bytes(conn.rx[2:2 + n])
    del conn.rx[:2 + n]
    return frame


def bind_control(eng: Engine, server_addr: tuple[str, int], server_rank: int, hello: dict,
                 timeout: float) -> TcpControl:
    """Member side of TCP control: connect, prove this connection, until the aggregator says so.

    The aggregator's first frame on a new connection carries that connection's
    nonce; the member's HELLO (marked TCP, the session, its join's nonce)
    carries it back under the MAC, and the aggregator answers with a frame
    sealed for this rank that echoes it. A connection closed before that
    answer (evicted by a burst of unauthenticated connects, say) is replaced
    by a new one until ``timeout``.
    """
    deadline = time.monotonic() + timeout
    where = f"{server_addr[0]}:{server_addr[1]}"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TransportError(f"rank {eng.rank}: no TCP control connection to the aggregator "
                                 f"at {where} within {timeout} s")
        try:
            sock = socket.create_connection(server_addr, timeout=left)
            conn = TcpControl(sock, peer=server_rank, nagle=eng.nagle)
        except OSError:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            continue
        if _prove_control(eng, conn, server_rank, hello, deadline):
            return conn
        conn.close()
        time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))


def _prove_control(eng: Engine, conn: TcpControl, server_rank: int, hello: dict,
                   deadline: float) -> bool:
    """One try of `bind_control` on ``conn``: True once the aggregator confirmed it."""
    frame = _read_frame(conn, deadline)
    try:
        if frame is None:
            return False
        h = wire.unpack_header(frame)
        if h.type != MsgType.CHALLENGE or h.src != server_rank:
            return False
        conn_nonce = get_int(parse_object(frame[wire.HEADER_SIZE:wire.HEADER_SIZE + h.length]),
                             "conn", 1, 2**62)
        conn.send(eng.sealer.seal(_msg(MsgType.HELLO, dict(hello, conn=conn_nonce), src=eng.rank,
                                       session=eng.session, flags=Flag.TCP), server_rank))
        frame = _read_frame(conn, deadline)
        if frame is None or not eng.sealer.verify(frame, len(frame), eng.rank):
            return False
        h = wire.unpack_header(frame)
        if h.type != MsgType.WELCOME or h.src != server_rank or h.session != eng.session:
            return False
        body = frame[wire.HEADER_SIZE:wire.HEADER_SIZE + h.length]
        return get_int(parse_object(body), "conn", 1, 2**62) == conn_nonce
    except (wire.MalformedDatagram, Refused, PeerClosed):
        return False
