"""Blocked sources dropped by the kernel: a classic BPF filter on the engine's UDP socket.

Why: under a flood `dblp.engine_state.BadSources` blocks a source that keeps sending bad
tags, and the engine then drops its datagrams by address before verifying
them. Dropping them in user space still costs the receiver a copy and a turn
of its receive loop per datagram, and a flood fills the socket's buffer, so
honest datagrams queued behind it are lost. A socket filter runs where the
kernel queues the datagram: a blocked source's datagrams never reach the
buffer, and on loopback or a shared host the work of dropping them is done
in the sender's own context, so the flood costs the flooder, not the job.

The program lists the blocked (IPv4 address, UDP port) pairs, five
instructions each. A keyed job adds what it may hear at all (``allow``): a
join message from anyone, anything else only with the job's session from a
member's pinned address, the checks `Engine.worth_verifying` makes before any
MAC. A flood that rotates its sources or sessions is then dropped where the
kernel queues it, as a blocked source is. With neither, no filter is
attached. The filter only ever drops what the engine already drops by
address, session or length (a peer's pinned address is never blocked), so it
changes what a flood costs, never what a round receives.
"""
from __future__ import annotations

import ctypes
import socket
import struct

from . import wire

SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)
SO_DETACH_FILTER = getattr(socket, "SO_DETACH_FILTER", 27)
SO_MEMINFO = 55  # getsockopt: the socket's memory counters, the last of them its drops
_SK_MEMINFO_DROPS = 8
#: Negative offsets in a socket filter address the network header; the filter of a UDP
#: socket otherwise starts at the UDP header (its source port at offset 0).
_SKF_NET_OFF = -0x100000
_LD_W_ABS, _LD_H_ABS, _LD_B_ABS, _LD_W_LEN = 0x20, 0x28, 0x30, 0x80
_JEQ_K, _JGE_K, _RET_K = 0x15, 0x35, 0x06
#: Where the transport's header starts in what a UDP socket's filter sees (after the
#: UDP header), and its fields there.
_UDP_HEADER = 8
_TYPE_AT = _UDP_HEADER + wire.FIELD_OFFSETS["type"][0]
_SESSION_AT = _UDP_HEADER + wire.FIELD_OFFSETS["session"][0]
_ACCEPT, _DROP = 0xFFFFFFFF, 0
#: Sources the kernel filter lists at most (5 instructions each, below the kernel's 4,096);
#: past that, the rest are still dropped by address in user space.
MAX_SOURCES = 512


def _sources(keys: bytes, verdict: int) -> list[tuple[int, int, int, int]]:
    """Return ``verdict`` for a datagram from one of ``keys``; fall through otherwise."""
    ins = []
    for off in range(0, min(len(keys), 6 * MAX_SOURCES) - 5, 6):
        port, ip = struct.unpack_from("!HI", keys, off)
        ins += [(_LD_W_ABS, 0, 0, (_SKF_NET_OFF + 12) & 0xFFFFFFFF),  # A = source address
                (_JEQ_K, 0, 3, ip),                                   # not it: next source
                (_LD_H_ABS, 0, 0, 0),                                 # A = source port
                (_JEQ_K, 0, 1, port),                                 # not it: next source
                (_RET_K, 0, 0, verdict)]
    return ins


def program(keys: bytes, allow: tuple[int, bytes] | None = None) -> list[tuple[int, int, int, int]]:
    """The filter for ``keys`` (6 bytes a source: port, then IPv4 address, both in network
    order, as `dblp.batch.blocked_keys` packs them) and ``allow`` ((session, the members'
    addresses packed as ``keys``), or None: everything not blocked): (code, jt, jf, k)
    instructions. Every jump is forward and short (a classic BPF jump is at most 255)."""
    ins = _sources(keys, _DROP)
    if allow is None:
        return ins + [(_RET_K, 0, 0, _ACCEPT)]
    session, members = allow
    ins += [(_LD_W_LEN, 0, 0, 0),                                    # A = UDP length
            (_JGE_K, 1, 0, _UDP_HEADER + wire.HEADER_SIZE),          # a whole header: go on
            (_RET_K, 0, 0, _DROP),
            (_LD_B_ABS, 0, 0, _TYPE_AT)]                             # A = message type
    for t in sorted(wire.JOIN_TYPES):                                # a join: anyone's
        ins += [(_JEQ_K, 0, 1, t), (_RET_K, 0, 0, _ACCEPT)]
    ins += [(_LD_W_ABS, 0, 0, _SESSION_AT),                          # the job's session
            (_JEQ_K, 1, 0, session >> 32), (_RET_K, 0, 0, _DROP),
            (_LD_W_ABS, 0, 0, _SESSION_AT + 4),
            (_JEQ_K, 1, 0, session & 0xFFFFFFFF), (_RET_K, 0, 0, _DROP)]
    return ins + _sources(members, _ACCEPT) + [(_RET_K, 0, 0, _DROP)]   # from a member


def drop_sources(sock: socket.socket, keys: bytes, allow: tuple[int, bytes] | None = None) -> None:
    """Make the kernel drop ``sock``'s datagrams from the sources in ``keys`` and, with
    ``allow``, every one a keyed job cannot be hearing (`program`); neither: detach the
    filter. Replacing a filter is atomic: no datagram meets neither."""
    if not keys and allow is None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
        except OSError:
            pass  # no filter was attached
        return
    ins = program(keys, allow)
    code = ctypes.create_string_buffer(b"".join(struct.pack("=HBBI", *i) for i in ins))
    fprog = struct.pack("=HxxxxxxQ" if struct.calcsize("P") == 8 else "=HxxI",
                        len(ins), ctypes.addressof(code))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)  # the kernel copies it


def socket_drops(sock: socket.socket) -> int | None:
    """Datagrams the kernel dropped for ``sock`` (its filter's and a full buffer's), or
    None where the kernel does not say."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 4 * (_SK_MEMINFO_DROPS + 1))
    except OSError:
        return None
    return struct.unpack_from("=I", raw, 4 * _SK_MEMINFO_DROPS)[0] \
        if len(raw) >= 4 * (_SK_MEMINFO_DROPS + 1) else None
