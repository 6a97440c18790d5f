"""Pcaps -> packet tables: what actually crossed the wire, per arm x round x direction.

The transport's own counters say what it *meant* to send; the captures say
what the network carried. Each RUN/raw/<arm>/seed-<seed>/<host>.pcap is dissected with
scapy, DBLP traffic with the layer the wire format declares
(`dblp.scapy_layer.DBLP`, bound to the transport's UDP port with `bind`).

How packets are attributed (all exact, no tolerances):
- Each capture is named after its role (server.pcap, worker0.pcap); the
  roles' addresses are resolved from all captures together (resolve_addresses).
- Round: the DBLP header's round counter, mapped onto the logged round
  numbers by the offset most packets agree on (the counter may start at 1
  or wrap); packets without a DBLP header (gloo's TCP) go to the round whose
  window [t_start, next t_start) holds their timestamp (one shared clock).
- Retransmission: a data packet seen again on the sender with the same
  (flow, round, sequence) for DBLP, or the same (flow, TCP sequence) with a
  payload for TCP.
- Drops on a flow = packets the sender's pcap shows it sent minus packets the
  receiver's pcap shows it received; known only when both ends were captured.
"""
from __future__ import annotations

import collections
import math
import pathlib
import socket
import struct

import numpy as np
import pandas as pd

from dblp import scapy_layer, wire
from dblp.server import DEFAULT_PORT
from testbed.analysis import datasets
from testbed.analysis.arms import arm_transport
from testbed.rundir import unit_dir
from workloads.runlog import seed_of_dir

PACKET_COLUMNS = datasets.CAPTURE_COLUMNS
TABLE_COLUMNS = datasets.FLOWS.names()

_PULL_BIT = int(wire.Flag.PULL)
_TYPES = {int(t): t.name.lower() for t in wire.MsgType}
_DATA = int(wire.MsgType.DATA)
# Transports whose TCP traffic is the control path, not gradient bytes.
_UDP_DATA_TRANSPORTS = ("dblp", "static", "reliable")


def dblp_layer(port: int = DEFAULT_PORT):
    """The DBLP scapy layer (generated from dblp.wire), bound to `port`."""
    scapy_layer.bind(port)
    return scapy_layer.DBLP


def _dblp_fields(h: dict) -> dict:
    """Packet-table columns of one DBLP header, given as {wire field name: value}."""
    is_data = h["type"] == _DATA
    return {"proto": "dblp", "kind": _TYPES.get(h["type"], str(h["type"])),
            "hdr_round": h["round"], "seq": h["index"],
            # session:sender rank:part:pull (the phase bit does not make a stream)
            "stream": f"{h['session']}:{h['src']}:{h['part']}:{h['flags'] & _PULL_BIT}",
            "pass_no": h["aux"] if is_data else None, "is_data": is_data}


def read_pcap(path, arm: str, host: str, port: int = DEFAULT_PORT) -> pd.DataFrame:
    """One row per IPv4 packet of one pcap (truncated captures are fine).

    Full scapy dissection runs at ~4k packets/s here, far too slow for a
    run's captures (hundreds of thousands of packets). So scapy's raw reader
    yields the frames, the IPv4/UDP/TCP headers are unpacked directly and the
    DBLP header with `dblp.wire`'s declaration, the one the scapy layer is
    generated from; the first DBLP packet of every capture is also dissected
    with the scapy layer and must agree field by field, else the whole
    capture is dissected with scapy instead.
    """
    from scapy.utils import RawPcapReader

    hdr = struct.Struct(wire.HEADER_FORMAT)
    names = wire.FIELD_NAMES
    tcp_is_control = arm_transport(arm) in _UDP_DATA_TRANSPORTS
    # Column lists, not a dict per packet: a run's captures hold ~10^6 packets.
    cols = {c: [] for c in PACKET_COLUMNS}
    first = None
    with RawPcapReader(str(path)) as reader:
        link = getattr(reader, "linktype", 1)
        if link not in _L2_HEADER:
            return _read_pcap_scapy(path, arm, host, port)
        nano = bool(getattr(reader, "nano", False))
        for buf, meta in reader:
            off = _l3_offset(buf, link)
            if off is None or len(buf) < off + 20 or buf[off] >> 4 != 4:
                continue
            ihl = (buf[off] & 0x0F) * 4
            ip_len, proto = struct.unpack_from("!H", buf, off + 2)[0], buf[off + 9]
            src = socket.inet_ntoa(buf[off + 12:off + 16])
            dst = socket.inet_ntoa(buf[off + 16:off + 20])
            if hasattr(meta, "sec"):
                t_ns = meta.sec * 1_000_000_000 + meta.usec * (1 if nano else 1000)
            else:  # pcapng
                ts = (meta.tshigh << 32) | meta.tslow
                t_ns = ts * 1_000_000_000 // meta.tsresol
            row = dict(_EMPTY_ROW, arm=arm, host=host, t_ns=t_ns, src=src, dst=dst,
                       ip_bytes=ip_len)
            l4 = off + ihl
            if proto == 17 and len(buf) >= l4 + 8:
                sport, dport, ulen = struct.unpack_from("!HHH", buf, l4)
                row.update(proto="udp", sport=sport, dport=dport, payload=max(0, ulen - 8))
                if port in (sport, dport) and len(buf) >= l4 + 8 + hdr.size:
                    h = dict(zip(names, hdr.unpack_from(buf, l4 + 8), strict=True))
                    if h["magic"] == wire.MAGIC:
                        row.update(_dblp_fields(h))
                        if first is None:
                            first = (bytes(buf), link, h)
            elif proto == 6 and len(buf) >= l4 + 20:
                seq = struct.unpack_from("!I", buf, l4 + 4)[0]
                pl = max(0, ip_len - ihl - (buf[l4 + 12] >> 4) * 4)
                row.update(proto="tcp", sport=struct.unpack_from("!H", buf, l4)[0],
                           dport=struct.unpack_from("!H", buf, l4 + 2)[0], tcp_seq=seq,
                           payload=pl, is_data=pl > 0 and not tcp_is_control,
                           kind="tcp-control" if tcp_is_control else "tcp")
            for c in PACKET_COLUMNS:
                cols[c].append(row[c])
    if first is not None and not _layer_agrees(first, port):
        return _read_pcap_scapy(path, arm, host, port)
    return pd.DataFrame(cols, columns=PACKET_COLUMNS)


# The seed is the unit's, set by read_unit (a pcap knows only its arm and host).
_EMPTY_ROW = {"seed": None, "sport": None, "dport": None, "proto": "ip", "kind": None,
              "hdr_round": None, "seq": None, "stream": None, "pass_no": None, "tcp_seq": None, "payload": 0,
              "is_data": False}


# Link types tcpdump writes: Ethernet, Linux cooked v1 and v2, raw IPv4.
_L2_HEADER = {1: 14, 113: 16, 276: 20, 101: 0, 12: 0, 228: 0}


def _l3_offset(buf: bytes, link: int) -> int | None:
    off = _L2_HEADER[link]
    if link == 1:
        etype = struct.unpack_from("!H", buf, 12)[0] if len(buf) >= 14 else 0
        while etype == 0x8100 and len(buf) >= off + 4:  # VLAN tags
            etype = struct.unpack_from("!H", buf, off + 2)[0]
            off += 4
        return off if etype == 0x0800 else None
    return off


def _layer_agrees(first, port: int) -> bool:
    """Dissect one frame with the scapy DBLP layer: same fields as the wire declaration?"""
    from scapy.layers.inet import IP
    from scapy.layers.l2 import CookedLinux, Ether

    buf, link, fields = first
    DBLP = dblp_layer(port)
    if link == 1:
        pkt = Ether(buf)
    elif link == 113:
        pkt = CookedLinux(buf)
    else:
        pkt = IP(buf[_L2_HEADER[link]:])
    layer = pkt.getlayer(DBLP)
    if layer is None:
        return False
    return all(int(layer.getfieldval(n)) == int(v) for n, v in fields.items())


def _read_pcap_scapy(path, arm: str, host: str, port: int = DEFAULT_PORT) -> pd.DataFrame:
    """Full scapy dissection, packet by packet: slow (~4k packets/s), any link type."""
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.utils import PcapReader

    DBLP = dblp_layer(port)
    tcp_is_control = arm_transport(arm) in _UDP_DATA_TRANSPORTS
    rows = []
    with PcapReader(str(path)) as reader:
        for pkt in reader:
            ip = pkt.getlayer(IP)
            if ip is None:
                continue
            t_ns = int(round(pkt.time * 1_000_000_000))  # EDecimal: exact
            row = dict(_EMPTY_ROW, arm=arm, host=host, t_ns=t_ns, src=ip.src, dst=ip.dst,
                       ip_bytes=int(ip.len))
            if ip.haslayer(UDP):
                u = ip[UDP]
                row.update(proto="udp", sport=int(u.sport), dport=int(u.dport),
                           payload=max(0, int(u.len) - 8))
                layer = pkt.getlayer(DBLP)
                if layer is not None:
                    row.update(_dblp_fields({n: int(layer.getfieldval(n)) for n in wire.FIELD_NAMES}))
            elif ip.haslayer(TCP):
                t = ip[TCP]
                pl = max(0, int(ip.len) - 4 * int(ip.ihl) - 4 * int(t.dataofs))
                row.update(proto="tcp", sport=int(t.sport), dport=int(t.dport),
                           tcp_seq=int(t.seq), payload=pl, is_data=pl > 0 and not tcp_is_control,
                           kind="tcp-control" if tcp_is_control else "tcp")
            rows.append(row)
    return pd.DataFrame(rows, columns=PACKET_COLUMNS)


def resolve_addresses(captures: dict) -> tuple[dict, list[str]]:
    """Address of each capturing role, from every capture of the run at once.

    captures: {(unit, role): packets}, unit naming the capture's directory
    ("dblp/seed-1"). A pcap has no direction, so a host that
    only ever talks to one peer is ambiguous on its own. In order:
    1. a capture with three or more endpoints: the endpoint in most packets;
    2. a two-endpoint capture whose other endpoint is already another role's;
    3. DBLP: the sender of DATA without the PULL flag is a member (worker),
       its receiver the aggregator;
    4. otherwise the most frequent endpoint, with a warning.
    The same role is the same host in every unit.
    """
    out: dict = {}
    notes: list[str] = []
    ends = {}
    for key, df in captures.items():
        if len(df):
            c = collections.Counter(df["src"]) + collections.Counter(df["dst"])
            ends[key] = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))
    for (_, role), e in sorted(ends.items()):
        if role not in out and len(e) >= 3:
            out[role] = e[0][0]
    changed = True
    while changed:
        changed = False
        for (_, role), e in sorted(ends.items()):
            if role in out:
                continue
            taken = {a for r, a in out.items() if r != role}
            free = [a for a, _ in e if a not in taken]
            if len(free) == 1:
                out[role] = free[0]
                changed = True
    for (arm, role), e in sorted(ends.items()):
        if role in out:
            continue
        df = captures[(arm, role)]
        data = df[(df["proto"] == "dblp") & df["is_data"].astype(bool)]
        if len(data):
            push = data[data["stream"].astype(str).str.endswith(":0")]
            cand = push["src"] if not role.startswith("server") else push["dst"]
            if len(cand):
                out[role] = collections.Counter(cand).most_common(1)[0][0]
                continue
        out[role] = e[0][0]
        notes.append(f"capture {arm}/{role}.pcap: own address ambiguous, took {e[0][0]}")
    return out, notes


def read_unit(run_dir, arm: str, seed: int, port: int = DEFAULT_PORT,
              notes: list[str] | None = None) -> dict:
    """All pcaps of one unit (raw/<arm>/seed-<seed>/) -> {role: packets} (role = the
    pcap's file stem), each packet's ``seed`` set.

    A capture that is not one (empty, garbage, cut in its file header) costs
    only itself: it is left out and `notes` gets a line naming it.
    """
    from scapy.error import Scapy_Exception

    out = {}
    for path in sorted(unit_dir(run_dir, arm, seed).glob("*.pcap")):
        try:
            out[path.stem] = read_pcap(path, arm, path.stem, port).assign(seed=seed)
        except (Scapy_Exception, EOFError, OSError, ValueError, struct.error) as exc:
            if notes is not None:
                notes.append(f"capture raw/{arm}/seed-{seed}/{path.name} unreadable, left out: "
                             f"{str(exc).strip() or type(exc).__name__}")
    return out


def unit_seeds(run_dir, arm: str) -> list[int]:
    """The seeds of arm's unit directories present under RUN/raw/<arm>/, in order."""
    d = pathlib.Path(run_dir) / "raw" / arm
    seeds = [seed_of_dir(p.name) for p in d.glob("*/")] if d.is_dir() else []
    return sorted(s for s in seeds if s is not None)


def server_address(pk: pd.DataFrame, hosts: dict) -> str | None:
    """The aggregation server's address: the `server` capture's, else the busiest peer."""
    if hosts.get("server"):
        return hosts["server"]
    if not len(pk):
        return None
    # The server talks to every worker; a worker talks to the server only.
    peers = collections.defaultdict(set)
    for s, d in zip(pk["src"], pk["dst"], strict=True):
        peers[s].add(d)
        peers[d].add(s)
    return sorted(peers.items(), key=lambda kv: (-len(kv[1]), kv[0]))[0][0]


def assign_rounds(pk: pd.DataFrame, rounds: pd.DataFrame) -> pd.Series:
    """Logged round of each packet: header counter (offset-corrected) or timestamp."""
    out = pd.Series(np.nan, index=pk.index, dtype=float)
    if not len(pk) or not len(rounds):
        return out
    r = rounds.sort_values("t_start_ns")
    starts = r["t_start_ns"].to_numpy(dtype=np.int64)
    nums = r["round"].to_numpy()
    idx = np.searchsorted(starts, pk["t_ns"].to_numpy(dtype=np.int64), side="right") - 1
    by_time = np.where(idx >= 0, nums[np.clip(idx, 0, len(nums) - 1)], np.nan).astype(float)
    out[:] = by_time
    hdr = pd.to_numeric(pk["hdr_round"], errors="coerce")
    have = hdr.notna() & ~np.isnan(by_time)
    if have.any():
        offsets = (hdr[have] - by_time[have.to_numpy()]).astype(int)
        offset = int(offsets.value_counts().sort_index().idxmax())
        mapped = hdr - offset
        known = set(nums.tolist())
        ok = hdr.notna() & mapped.isin(known)
        out[ok] = mapped[ok]
    return out


def packet_table(run_dir, arms: list[str], rounds: pd.DataFrame, port: int = DEFAULT_PORT
                 ) -> tuple[pd.DataFrame, pd.DataFrame, dict, list[str]]:
    """(per-round table, every packet, {(arm, seed): {role: address, "server_address": ...}},
    notes), over every unit directory of the arms (`unit_seeds`)."""
    captures, notes = {}, []
    units = [(arm, seed) for arm in arms for seed in unit_seeds(run_dir, arm)]
    for arm, seed in units:
        for role, df in read_unit(run_dir, arm, seed, port, notes).items():
            captures[(f"{arm}/seed-{seed}", role)] = df
    hosts, more = resolve_addresses(captures)
    notes += more
    tables, allpk, addrs = [], [], {}
    for arm, seed in units:
        where = f"{arm}/seed-{seed}"
        frames = [df for (u, _), df in sorted(captures.items()) if u == where and len(df)]
        if not frames:
            continue
        pk = pd.concat(frames, ignore_index=True)
        arm_hosts = {r: hosts.get(r) for (u, r) in captures if u == where}
        srv = hosts.get("server")
        if srv is None and arm_transport(arm) in _UDP_DATA_TRANSPORTS:
            srv = server_address(pk, {})
        addrs[(arm, seed)] = dict(arm_hosts, server_address=srv)
        pk["round"] = assign_rounds(pk, rounds[(rounds["arm"] == arm) & (rounds["seed"] == seed)]
                                    if len(rounds) else rounds)
        host_of = {a: h for h, a in arm_hosts.items() if a}
        pk = pk.sort_values(["host", "t_ns"], kind="stable").reset_index(drop=True)
        own = pk["host"].map(arm_hosts)
        sent = pk[pk["src"] == own].copy()   # what a captured host transmitted
        recv = pk[pk["dst"] == own].copy()   # what a captured host received
        key = np.where(sent["proto"] == "tcp",
                       sent["src"] + ">" + sent["dst"] + ":" + sent["sport"].astype(str) + ":"
                       + sent["dport"].astype(str) + ":" + sent["tcp_seq"].astype(str),
                       sent["src"] + ">" + sent["dst"] + ":" + sent["sport"].astype(str) + ":"
                       + sent["dport"].astype(str) + ":" + sent["stream"].astype(str) + ":"
                       + sent["hdr_round"].astype(str) + ":" + sent["seq"].astype(str))
        sent["retx"] = pd.Series(key, index=sent.index).duplicated() & sent["is_data"].astype(bool)
        sent["control"] = ~sent["is_data"].astype(bool)
        g = ["round", "src", "dst"]
        s = sent.groupby(g, dropna=False).agg(sent_packets=("ip_bytes", "size"),
                                               sent_bytes=("ip_bytes", "sum"),
                                               retransmissions=("retx", "sum"),
                                               control_packets=("control", "sum"))
        r = recv.groupby(g, dropna=False).agg(recv_packets=("ip_bytes", "size"),
                                              recv_bytes=("ip_bytes", "sum"))
        t = s.join(r, how="outer").reset_index()
        t["src_host"] = t["src"].map(host_of)
        t["dst_host"] = t["dst"].map(host_of)
        for c in ("sent_packets", "sent_bytes", "recv_packets", "recv_bytes",
                  "retransmissions", "control_packets"):
            t[c] = t[c].astype(float)
        # A flow is fully observed only when both its ends were captured.
        t.loc[t["src_host"].isna(), ["sent_packets", "sent_bytes", "retransmissions",
                                     "control_packets"]] = math.nan
        t.loc[t["dst_host"].isna(), ["recv_packets", "recv_bytes"]] = math.nan
        both = t["src_host"].notna() & t["dst_host"].notna()
        t["drops"] = np.where(both, t["sent_packets"].fillna(0) - t["recv_packets"].fillna(0),
                              math.nan)
        t["direction"] = np.where(t["dst"] == srv, "push",
                                  np.where(t["src"] == srv, "pull", "peer"))
        t["arm"], t["seed"] = arm, seed
        tables.append(t[TABLE_COLUMNS])
        allpk.append(pk)
    if not tables:
        return (pd.DataFrame(columns=TABLE_COLUMNS), pd.DataFrame(columns=PACKET_COLUMNS + ["round"]),
                addrs, notes)
    table = pd.concat(tables, ignore_index=True)
    table = table.sort_values(["arm", "seed", "round", "direction", "src", "dst"],
                              kind="stable", na_position="last").reset_index(drop=True)
    return table, pd.concat(allpk, ignore_index=True), addrs, notes


def burst_receptions(packets: pd.DataFrame, bursts: pd.DataFrame, addrs: dict) -> pd.DataFrame:
    """Count what the burst's target received in the window; fill in the loss if unknown.

    The controller's loss rule counts what it saw and what it dropped, which
    gives the loss exactly (tables.bursts_table). Without those counters the
    loss is dropped / (dropped + what the target's capture received in the
    burst window). Only targets that name a captured host's downlink
    (server-downlink, workerN-downlink) have a capture to count.
    """
    bursts = bursts.copy()
    if not len(bursts) or not len(packets):
        return bursts
    for i, b in bursts.iterrows():
        tgt = str(b["target"] or "")
        if not tgt.endswith("-downlink"):
            continue
        role = tgt[: -len("-downlink")]
        known = addrs.get((b["arm"], b["seed"]), {})
        addr = known.get(role) or (known.get("server_address") if role == "server" else None)
        capturing = [h for h, a in known.items() if a == addr and h != "server_address"]
        if addr is None or not capturing or pd.isna(b["actual_start_ns"]) \
                or pd.isna(b["actual_end_ns"]):
            continue
        pk = packets[(packets["arm"] == b["arm"]) & (packets["seed"] == b["seed"])
                     & (packets["host"] == capturing[0])
                     & (packets["dst"] == addr)]
        inwin = pk[(pk["t_ns"] >= int(b["actual_start_ns"])) & (pk["t_ns"] < int(b["actual_end_ns"]))]
        rec = int(len(inwin))
        bursts.at[i, "received_packets"] = rec
        dropped = pd.to_numeric(pd.Series([b["dropped_packets"]]), errors="coerce").iloc[0]
        # The controller's own seen/dropped counters win; the capture fills in without them.
        if pd.isna(b["measured_loss"]) and pd.notna(dropped) and dropped + rec > 0:
            bursts.at[i, "measured_loss"] = float(dropped) / float(dropped + rec)
            bursts.at[i, "measured_loss_source"] = "capture"
    return bursts
