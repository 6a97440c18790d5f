"""Two network namespaces joined by an HTB-shaped veth pair: the emulator of `bench transport`.

Namespaces ``dbt-<tag>-a`` and ``dbt-<tag>-b`` joined by a veth pair; each
end's egress is shaped with HTB (default 100 Mbit/s, pfifo child). Every
segmentation offload is off on both ends (TSO, GSO, and the veth's UDP
segmentation): the kernel cuts every TCP or UDP GSO packet before the veth,
so the shaper counts and the loss hook drops MTU-sized packets. TX checksum
offload is on, as on any NIC, so neither kernel checksums every byte in
software, for TCP and UDP alike (``NetnsPair.OFFLOADS``). The veth keeps UDP
segmentation on with checksum offload unless told otherwise: a UDP GSO
message of up to 44 datagrams then crossed it whole and was dropped or kept
whole (one run at 50 % loss: 0 resends in 57 chunks), so the pair checks the
setting took and falls back to checksums in software if it did not. Random
loss is an nftables ``numgen random`` drop on the input hook of both
namespaces, applied to every packet of the protocols asked for (the bench:
every UDP and TCP packet), so "loss p" means p in each direction. Receive
offload (GRO) is turned on or off at both ends (``NetnsPair.set_gro``): on
for a loss-free link, off whenever a loss is set.

Everything the pair creates is named ``dbt-*``/``dbt*`` and removed on exit
(namespaces take their veths and nft tables with them). The tag starts with
the owner's PID, so a pair whose bench died without its exit (SIGKILL) is
known for a dead process's and `dblp-testbed clean` removes it
(`testbed.emulation.cleanup.project_namespaces`). Why it is apart from
the fabric (`testbed.emulation.fabric`): two hosts and one link need no
switch, controller or Mininet, and a transport's own costs show best on them.
"""
from __future__ import annotations

import os
import secrets
import subprocess

import click

from controllers.traffic import nft_matches

#: The veth's shaped rate unless told otherwise (bit/s).
DEFAULT_RATE = 100e6


def _run(*cmd: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True, input=input)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


def owner_tag(pid: int | None = None) -> str:
    """A pair's tag: the owner's PID in six hex digits, then three random ones."""
    return f"{os.getpid() if pid is None else pid:06x}{secrets.token_hex(2)[:3]}"


class NetnsPair:
    """Two namespaces joined by an HTB-shaped veth pair; removed on exit.

    ``set_loss(p, protocols)`` installs (or replaces) an nftables drop of a
    fraction ``p`` of incoming packets of those protocols in both namespaces.

    ``set_gro(on)`` turns receive offload (GRO) on or off at both ends. A veth
    with it on runs in NAPI mode and coalesces a run of one flow's packets
    before the stack sees them, as a real NIC does: TCP always, UDP for a
    socket that asks (``dblp.batch.UDP_GRO``). The loss hook sits behind GRO
    (nftables input), where it would drop a whole coalesced run at once, so a
    lossy link has it off: ``set_loss`` with ``p > 0`` turns it off first.
    """

    def __init__(self, rate_bps: float | None = DEFAULT_RATE, tag: str | None = None,
                 queue_packets: int = 1000):
        # The owner's PID (six hex digits hold any Linux PID, 2**22 at most), then three
        # random ones: "dbt" + nine + "a" fits the kernel's 15-byte interface names.
        tag = tag or owner_tag()
        self.tag = tag
        self.ns = (f"dbt-{tag}-a", f"dbt-{tag}-b")
        self.dev = (f"dbt{tag}a", f"dbt{tag}b")
        self.ip = ("10.201.0.1", "10.201.0.2")
        self.rate_bps = rate_bps
        self.queue_packets = queue_packets
        self.loss = 0.0
        self.gro = False
        self.checksum_offload = True  # False: checksums in software (see _set_offloads)
        self._created = False

    def __enter__(self) -> NetnsPair:
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def exec(self, side: int, *cmd: str, check: bool = True, input: str | None = None):
        return _run("ip", "netns", "exec", self.ns[side], *cmd, check=check, input=input)

    def create(self) -> None:
        a, b = self.ns
        self._created = True
        _run("ip", "netns", "add", a)
        _run("ip", "netns", "add", b)
        _run("ip", "link", "add", self.dev[0], "netns", a, "type", "veth", "peer", "name",
             self.dev[1], "netns", b)
        for side in (0, 1):
            dev = self.dev[side]
            self.exec(side, "ip", "link", "set", "lo", "up")
            self.exec(side, "ip", "addr", "add", f"{self.ip[side]}/30", "dev", dev)
            self.exec(side, "ip", "link", "set", dev, "up")
            self._set_offloads(side)
            if self.rate_bps:
                rate = f"{int(self.rate_bps)}bit"
                self.exec(side, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
                          "default", "10")
                self.exec(side, "tc", "class", "add", "dev", dev, "parent", "1:", "classid",
                          "1:10", "htb", "rate", rate, "ceil", rate)
                self.exec(side, "tc", "qdisc", "add", "dev", dev, "parent", "1:10", "handle",
                          "10:", "pfifo", "limit", str(self.queue_packets))

    #: ethtool -K settings: every segmentation offload off, TX checksum offload on.
    #: ``SOFTWARE_CHECKSUMS`` is the fallback where UDP segmentation would stay on.
    SOFTWARE_CHECKSUMS = ("tx", "off", "tso", "off", "gso", "off", "tx-udp-segmentation", "off")
    OFFLOADS = ("tx-udp-segmentation", "off", "tso", "off", "gso", "off", "tx", "on")

    def _set_offloads(self, side: int) -> None:
        """Checksum offload on and segmentation off at one end, or checksums in software.

        A kernel or ethtool that cannot turn the veth's UDP segmentation off
        while checksum offload is on would let GSO messages cross whole past
        the shaper and the loss hook: the pair then checksums in software (as
        it always did before) and says so.
        """
        dev = self.dev[side]
        self.exec(side, "ethtool", "-K", dev, *self.OFFLOADS, check=False)
        shown = self.exec(side, "ethtool", "-k", dev, check=False).stdout
        on = {line.split(":")[0].strip() for line in shown.splitlines()
              if line.split(":")[-1].split()[:1] == ["on"]}
        if on & {"tx-udp-segmentation", "tcp-segmentation-offload",
                 "generic-segmentation-offload"}:
            self.exec(side, "ethtool", "-K", dev, *self.SOFTWARE_CHECKSUMS, check=False)
            click.echo(f"bench: {dev} keeps a segmentation offload on with TX checksum "
                       "offload; checksums in software instead", err=True)
            on.discard("tx-checksumming")
        self.checksum_offload = self.checksum_offload and "tx-checksumming" in on

    def set_gro(self, on: bool) -> None:
        """Receive offload on or off at both ends (off whenever a loss is set)."""
        if on and self.loss > 0:
            raise ValueError("GRO would coalesce packets before the loss hook drops them; "
                             "set the loss to 0 first")
        if on != self.gro:
            for side in (0, 1):
                self.exec(side, "ethtool", "-K", self.dev[side], "gro", "on" if on else "off")
            self.gro = on

    def set_loss(self, p: float, protocols: str = "udp, tcp", traffic: str = "all") -> None:
        """Drop a fraction ``p`` of incoming packets in both namespaces.

        ``traffic="all"``: every ``protocols`` packet. ``"data"`` or
        ``"control"``: only the transport's DATA datagrams, or only its control
        path (``controllers.traffic``), so a lossy link can spare what the
        experiment does not study.
        """
        if p > 0:
            self.set_gro(False)
        self.loss = p
        per_million = int(round(p * 1_000_000))
        matches = [f"meta l4proto {{ {protocols} }} "] if traffic == "all" else nft_matches(traffic)
        drops = "".join(f"        {m}numgen random mod 1000000 < {per_million} counter drop\n"
                        for m in matches)
        for side in (0, 1):
            self.exec(side, "nft", "delete", "table", "inet", "dbt", check=False)
            if p <= 0:
                continue
            rules = f"""table inet dbt {{
    chain input {{
        type filter hook input priority 0; policy accept;
{drops}    }}
}}
"""
            self.exec(side, "nft", "-f", "-", input=rules)

    def drop_counts(self) -> list[int]:
        out = []
        for side in (0, 1):
            p = self.exec(side, "nft", "list", "table", "inet", "dbt", check=False)
            n = 0
            for tok in p.stdout.split("packets")[1:]:
                n += int(tok.split()[0])
            out.append(n)
        return out

    TCP_COUNTERS = ("TcpExtTCPTimeouts", "TcpRetransSegs", "TcpExtTCPLossProbes")

    def tcp_counters(self) -> dict:
        """Kernel TCP counters summed over both namespaces (why TCP rows are slow)."""
        out = dict.fromkeys(self.TCP_COUNTERS, 0)
        for side in (0, 1):
            p = self.exec(side, "nstat", "-asz", *self.TCP_COUNTERS, check=False)
            for line in p.stdout.splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[0] in out:
                    out[parts[0]] += int(parts[1])
        return out

    def destroy(self) -> None:
        if not self._created:
            return
        for ns in self.ns:
            _run("ip", "netns", "del", ns, check=False)
        self._created = False

