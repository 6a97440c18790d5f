"""Which packets a loss takes: all of them, the transport's data, or its control path.

Why a choice: at 60-90 % loss that lasts a round, a bounded round's time is
set by how many passes its data needs and what each pass costs. A loss that
also takes the control path (PROBE, BITMAP, STOP, FINAL; the TCP control
connection) measures TCP's own collapse instead: from 50 % loss the
connection stalls in retransmission timeouts and neither bound gives a
ratio. ``data`` takes only DATA datagrams, ``control`` everything else of
the transport's, ``all`` every packet (the default, what a congested queue
does).

Declared once: the nftables match expressions the fabric's loss bursts
(``controllers.mechanisms.loss_script``, netdev egress hooks) and the
transport bench's namespaces (``testbed.emulation.netns``, inet input hook)
prefix to their rules. Each class is a list of matches, each one rule: nft
has no "or" between different expressions, and the lists' matches are
disjoint, so a packet meets at most one rule. A DATA chunk larger than one
MTU (the prototype's 8 KB bucket) leaves as IP fragments: the first carries
the DBLP header, the others only match as "a later fragment of UDP", which
only DATA makes (every control message fits one datagram).
"""
from __future__ import annotations

from dblp import wire

TRAFFIC = ("all", "data", "control")

# The DBLP header's magic and type, as bit offsets from the UDP header's start
# (nft's @th base): 64 bits of UDP header, then the DBLP header.
_MAGIC_OFF, _MAGIC_LEN = wire.FIELD_OFFSETS["magic"]
_TYPE_OFF, _TYPE_LEN = wire.FIELD_OFFSETS["type"]
_DBLP = (f"meta protocol ip ip protocol udp @th,{64 + 8 * _MAGIC_OFF},{8 * _MAGIC_LEN} "
         f"0x{wire.MAGIC:04x} ")
_TYPE = f"@th,{64 + 8 * _TYPE_OFF},{8 * _TYPE_LEN}"


def nft_matches(traffic: str) -> list[str]:
    """The match prefixes of ``traffic``'s rules ("": every packet), each ending in a space."""
    if traffic == "all":
        return [""]
    data = int(wire.MsgType.DATA)
    if traffic == "data":
        return [f"{_DBLP}{_TYPE} {data} ",
                "meta protocol ip ip protocol udp ip frag-off & 0x1fff != 0 "]
    if traffic == "control":
        return ["meta protocol ip ip protocol tcp ",
                f"{_DBLP}{_TYPE} != {data} "]
    raise ValueError(f"traffic {traffic!r} is not one of {', '.join(TRAFFIC)}")
