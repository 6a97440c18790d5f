"""Pcaps -> packet tables: what actually crossed the wire, per arm x round x direction.

The transport's own counters say what it *meant* to send; the captures say
what the network carried. Each RUN/raw/<arm>/<host>.pcap is dissected with
scapy, DBLP traffic with the layer the wire format declares
(`dblp.scapy_layer.DBLP`, bound to the transport's UDP port with `bind`).

How packets are attributed (all exact, no tolerances):
- The capturing host's address is the one that appears in every packet of
  its pcap (the most frequent endpoint).
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

import numpy as np
import pandas as pd

DEFAULT_PORT = 47474

PACKET_COLUMNS = ["arm", "host", "t_ns", "src", "dst", "sport", "dport", "proto", "kind",
                  "ip_bytes", "hdr_round", "seq", "tcp_seq", "payload", "is_data"]
TABLE_COLUMNS = ["arm", "round", "direction", "src", "dst", "src_host", "dst_host",
                 "sent_packets", "sent_bytes", "recv_packets", "recv_bytes",
                 "retransmissions", "drops", "control_packets"]

# Field names tried on the DBLP layer, first match wins: the layer is owned
# by the transport package, this keeps the reader tolerant of its naming.
_ROUND_FIELDS = ("round", "round_id", "rnd")
_SEQ_FIELDS = ("seq", "chunk", "index", "idx")
_TYPE_FIELDS = ("type", "kind", "msg_type", "mtype", "op")


def dblp_layer(port: int = DEFAULT_PORT):
    """The DBLP scapy layer bound to `port`, or None when the transport lacks one."""
    try:
        from dblp import scapy_layer
    except ImportError:
        return None
    scapy_layer.bind(port)
    return scapy_layer.DBLP


def _field(layer, names):
    for n in names:
        if n in layer.fields or any(f.name == n for f in layer.fields_desc):
            return n, layer.getfieldval(n)
    return None, None


def _type_name(layer, name, value):
    if name is None:
        return "data"
    fld = layer.get_field(name)
    i2s = getattr(fld, "i2s", None)
    if isinstance(i2s, dict) and value in i2s:
        return str(i2s[value]).lower()
    return str(value).lower()


def read_pcap(path, arm: str, host: str, port: int = DEFAULT_PORT) -> pd.DataFrame:
    """One row per IPv4 packet of one pcap (truncated captures are fine)."""
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.utils import PcapReader

    DBLP = dblp_layer(port)
    rows = []
    with PcapReader(str(path)) as reader:
        for pkt in reader:
            ip = pkt.getlayer(IP)
            if ip is None:
                continue
            t_ns = int(round(float(pkt.time) * 1e9))
            row = {"arm": arm, "host": host, "t_ns": t_ns, "src": ip.src, "dst": ip.dst,
                   "sport": None, "dport": None, "proto": "ip", "kind": None,
                   "ip_bytes": int(ip.len), "hdr_round": None, "seq": None, "tcp_seq": None,
                   "payload": 0, "is_data": False}
            if ip.haslayer(UDP):
                u = ip[UDP]
                row.update(proto="udp", sport=int(u.sport), dport=int(u.dport),
                           payload=max(0, int(u.len) - 8))
                layer = pkt.getlayer(DBLP) if DBLP is not None else None
                if layer is not None:
                    tname, tval = _field(layer, _TYPE_FIELDS)
                    kind = _type_name(layer, tname, tval)
                    _, rnd = _field(layer, _ROUND_FIELDS)
                    _, seq = _field(layer, _SEQ_FIELDS)
                    row.update(proto="dblp", kind=kind, hdr_round=rnd, seq=seq,
                               is_data=kind in ("data", "chunk", "0"))
            elif ip.haslayer(TCP):
                t = ip[TCP]
                pl = max(0, int(ip.len) - 4 * int(ip.ihl) - 4 * int(t.dataofs))
                row.update(proto="tcp", sport=int(t.sport), dport=int(t.dport),
                           tcp_seq=int(t.seq), payload=pl, is_data=pl > 0, kind="tcp")
            rows.append(row)
    return pd.DataFrame(rows, columns=PACKET_COLUMNS)


def host_address(df: pd.DataFrame) -> str | None:
    """The capturing host's IPv4 address: the endpoint present in most packets."""
    if not len(df):
        return None
    counts = collections.Counter(df["src"]) + collections.Counter(df["dst"])
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def read_arm(run_dir, arm: str, port: int = DEFAULT_PORT) -> tuple[pd.DataFrame, dict]:
    """All pcaps of one arm -> (packets, {host: address})."""
    frames, hosts = [], {}
    for path in sorted((pathlib.Path(run_dir) / "raw" / arm).glob("*.pcap")):
        df = read_pcap(path, arm, path.stem, port)
        hosts[path.stem] = host_address(df)
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=PACKET_COLUMNS), hosts
    return pd.concat(frames, ignore_index=True), hosts


def server_address(pk: pd.DataFrame, hosts: dict) -> str | None:
    """The aggregation server's address: the `server` capture's, else the busiest peer."""
    if hosts.get("server"):
        return hosts["server"]
    if not len(pk):
        return None
    # The server talks to every worker; a worker talks to the server only.
    peers = collections.defaultdict(set)
    for s, d in zip(pk["src"], pk["dst"]):
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


def packet_table(run_dir, arms: list[str], rounds: pd.DataFrame,
                 port: int = DEFAULT_PORT) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(per-round table, every packet, {arm: {host: address, "server": address}})."""
    tables, allpk, addrs = [], [], {}
    for arm in arms:
        pk, hosts = read_arm(run_dir, arm, port)
        if not len(pk):
            continue
        srv = server_address(pk, hosts)
        addrs[arm] = dict(hosts, server_address=srv)
        pk["round"] = assign_rounds(pk, rounds[rounds["arm"] == arm] if len(rounds) else rounds)
        host_of = {a: h for h, a in hosts.items() if a}
        pk = pk.sort_values(["host", "t_ns"], kind="stable").reset_index(drop=True)
        # Sender side: what a captured host transmitted.
        sent = pk[pk["src"] == pk["host"].map(hosts)].copy()
        recv = pk[pk["dst"] == pk["host"].map(hosts)].copy()
        key = np.where(sent["proto"] == "tcp",
                       sent["src"] + ">" + sent["dst"] + ":" + sent["sport"].astype(str) + ":"
                       + sent["dport"].astype(str) + ":" + sent["tcp_seq"].astype(str),
                       sent["src"] + ">" + sent["dst"] + ":" + sent["sport"].astype(str) + ":"
                       + sent["dport"].astype(str) + ":" + sent["hdr_round"].astype(str) + ":"
                       + sent["seq"].astype(str))
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
        both = t["src_host"].notna() & t["dst_host"].notna()
        for c in ("sent_packets", "sent_bytes", "recv_packets", "recv_bytes",
                  "retransmissions", "control_packets"):
            t[c] = t[c].astype(float)
        # A flow is fully observed only when both its ends were captured.
        t.loc[t["src_host"].isna(), ["sent_packets", "sent_bytes", "retransmissions",
                                     "control_packets"]] = math.nan
        t.loc[t["dst_host"].isna(), ["recv_packets", "recv_bytes"]] = math.nan
        t["drops"] = np.where(both, t["sent_packets"].fillna(0) - t["recv_packets"].fillna(0),
                              math.nan)
        t["direction"] = np.where(t["dst"] == srv, "push",
                                  np.where(t["src"] == srv, "pull", "other"))
        t["arm"] = arm
        tables.append(t[TABLE_COLUMNS])
        allpk.append(pk)
    if not tables:
        return (pd.DataFrame(columns=TABLE_COLUMNS), pd.DataFrame(columns=PACKET_COLUMNS + ["round"]),
                addrs)
    table = pd.concat(tables, ignore_index=True)
    table = table.sort_values(["arm", "round", "direction", "src", "dst"],
                              kind="stable", na_position="last").reset_index(drop=True)
    return table, pd.concat(allpk, ignore_index=True), addrs


def burst_receptions(packets: pd.DataFrame, bursts: pd.DataFrame, addrs: dict) -> pd.DataFrame:
    """Measured burst loss = dropped / (dropped + received by the target in the window).

    The controller counts exactly what it dropped; the target's capture
    counts exactly what got through. Only targets that name a captured
    host's downlink (server-downlink, workerN-downlink) can be measured.
    """
    bursts = bursts.copy()
    if not len(bursts) or not len(packets):
        return bursts
    for i, b in bursts.iterrows():
        tgt = str(b["target"] or "")
        if not tgt.endswith("-downlink"):
            continue
        role = tgt[: -len("-downlink")]
        known = addrs.get(b["arm"], {})
        addr = known.get(role) or (known.get("server_address") if role == "server" else None)
        capturing = [h for h, a in known.items() if a == addr and h != "server_address"]
        if addr is None or not capturing or pd.isna(b["actual_start_ns"]) \
                or pd.isna(b["actual_end_ns"]):
            continue
        pk = packets[(packets["arm"] == b["arm"]) & (packets["host"] == capturing[0])
                     & (packets["dst"] == addr)]
        inwin = pk[(pk["t_ns"] >= int(b["actual_start_ns"])) & (pk["t_ns"] < int(b["actual_end_ns"]))]
        rec = int(len(inwin))
        bursts.at[i, "received_packets"] = rec
        dropped = pd.to_numeric(pd.Series([b["dropped_packets"]]), errors="coerce").iloc[0]
        if pd.notna(dropped) and dropped + rec > 0:
            bursts.at[i, "measured_loss"] = float(dropped) / float(dropped + rec)
    return bursts
