"""Who may speak OpenFlow to the controller: the switches' own processes, nobody else.

Why a check of the peer rather than TLS: the controller listens on TCP
(127.0.0.1 on one machine, this machine's address towards the others in the
cluster edition), and OpenFlow has no authentication of its own, so any
local user could connect, claim a switch's DPID and receive its flow
programming, or feed the port statistics the analysis reads. OVS and os-ken
both speak ``ssl:``, but OVS keeps one SSL configuration per daemon
(``ovs-vsctl set-ssl``: one key, certificate and CA for every bridge and
manager of the machine, whatever else it runs), so a per-fabric certificate
would change, and have to restore, a setting the fabric does not own, on
every server; a crash between the two leaves the machine's OVS pointing at
deleted files. The kernel already knows who owns each end of a TCP
connection on this machine: ``/proc/net/tcp`` lists the peer's socket, in
this network namespace, with the uid that opened it. So a peer on this
machine is accepted only if its socket is owned by root or by the user
``ovs-vswitchd`` runs as (`switch_uids`); an unprivileged user's connection
is refused before the controller sends it anything. A peer that is not on
this machine (the cluster edition's other servers) is accepted only from the
addresses the fabric names for those servers (``of_peer_addrs``). What this
leaves open, said plainly: a local user *on another server* of a cluster
connects from that server's address; there the controller's other rule
holds (`FabricRouting`: a DPID already connected is refused, so a switch
cannot be taken over once it is up), and only TLS would close the window
before the switches connect.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket

#: ``/proc/net/tcp``'s state column for a connection both ends hold open.
TCP_ESTABLISHED = "01"
#: Where OVS writes ``ovs-vswitchd``'s pid, by distribution and by ``$OVS_RUNDIR``.
OVS_RUNDIRS = ("/run/openvswitch", "/var/run/openvswitch")


def _proc_address(text: str) -> tuple[str, int]:
    """``/proc/net/tcp{,6}``'s ``HEX:PORT`` as (address, port): 32-bit words in host order."""
    hexaddr, hexport = text.split(":")
    raw = b"".join(bytes.fromhex(hexaddr[i:i + 8])[::-1] for i in range(0, len(hexaddr), 8))
    addr = ipaddress.ip_address(raw)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr), int(hexport, 16)


def _canon(addr: str) -> str:
    a = ipaddress.ip_address(addr.split("%", 1)[0])
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    return str(a)


def socket_owner(peer: tuple[str, int], ours: tuple[str, int],
                 tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> tuple[str, int] | None:
    """(state, uid) of the socket at ``peer`` connected to ``ours``, if it lives in this namespace.

    None: no such socket here, so the peer is another machine (or another
    network namespace). The state is ``/proc``'s two-hex-digit code; only an
    established socket's uid is the uid of a process that still holds it
    (a TIME_WAIT entry shows 0).
    """
    want = ((_canon(peer[0]), int(peer[1])), (_canon(ours[0]), int(ours[1])))
    for table in tables:
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 8:
                continue
            try:
                here = (_proc_address(cols[1]), _proc_address(cols[2]))
            except ValueError:
                continue
            if here == want:
                return cols[3], int(cols[7])
    return None


def switch_uids(rundirs: tuple[str, ...] = OVS_RUNDIRS) -> frozenset[int]:
    """Root and the owner of the running ``ovs-vswitchd`` (some distributions run it unprivileged)."""
    uids = {0}
    dirs = ((os.environ["OVS_RUNDIR"],) if os.environ.get("OVS_RUNDIR") else ()) + tuple(rundirs)
    for d in dirs:
        try:
            with open(os.path.join(d, "ovs-vswitchd.pid")) as f:
                pid = int(f.read().strip())
            uids.add(os.stat(f"/proc/{pid}").st_uid)
        except (OSError, ValueError):
            continue
    return frozenset(uids)


@dataclasses.dataclass(frozen=True)
class PeerPolicy:
    """Which OpenFlow peers the controller accepts: local sockets by owner, remote ones by address."""

    uids: frozenset[int]
    remote_addrs: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, cfg: dict) -> PeerPolicy:
        """``of_peer_uids`` (default `switch_uids`) and ``of_peer_addrs`` (the other servers)."""
        uids = cfg.get("of_peer_uids")
        return cls(uids=frozenset(int(u) for u in uids) if uids is not None else switch_uids(),
                   remote_addrs=frozenset(_canon(a) for a in cfg.get("of_peer_addrs") or ()))

    def check(self, sock: socket.socket) -> str | None:
        """None if the connection's peer may program switches, else why not (one line)."""
        try:
            peer, ours = sock.getpeername()[:2], sock.getsockname()[:2]
        except OSError as exc:
            return f"its socket has no peer ({exc})"
        owner = socket_owner(peer, ours)
        if owner is None:
            if _canon(peer[0]) in self.remote_addrs:
                return None
            return f"{peer[0]}:{peer[1]} is not one of the fabric's servers"
        state, uid = owner
        if state != TCP_ESTABLISHED:
            return f"{peer[0]}:{peer[1]} on this machine is no longer connected"
        if uid not in self.uids:
            return f"{peer[0]}:{peer[1]} is a socket of uid {uid}, not of the switches' ({sorted(self.uids)})"
        return None
