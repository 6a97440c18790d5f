"""``loss``: random drop on the target's ports by an nftables rule (``controllers.mechanisms``)."""
from __future__ import annotations

import time

from controllers.kinds.base import BurstKind, P, Param
from controllers.mechanisms import (
    NFT_PREFIX,
    Nft,
    loss_hooks,
    loss_script,
    loss_table_name,
    parse_loss_counters,
)


class LossKind(BurstKind):
    """A netdev table that steals each packet leaving the target with probability p.

    Off reads the table's counters: what crossed the hooks (seen) and what
    was stolen (dropped).
    """

    name = "loss"
    params = {"p": Param(P, 0.8, "drop probability of each packet leaving the target")}
    doc = "nftables egress rule stealing each packet with probability p"

    @classmethod
    def open(cls, app) -> Nft:
        """One nft context for every loss burst of the controller (in-process when it can be)."""
        nft = Nft()
        app.logger.info("loss bursts: nft %s", "in-process" if nft.in_process else "via nft(8)")
        return nft

    def __init__(self, app, rec, ports, shared: Nft | None = None):
        super().__init__(app, rec, ports, shared if shared is not None else Nft())
        self.hooks = loss_hooks(app.topo, self.ports)
        self.table = loss_table_name(self.tag(), app.cfg.get("nft_prefix", NFT_PREFIX))
        self.sink = app.cfg.get("loss_sink", "dtz0-eth0")

    def start(self) -> None:
        self.shared.run(loss_script(self.table, self.hooks, self.spec.params["p"], self.sink))
        return None

    def stop(self) -> None:
        # Two calls: one buffer with "list" then "delete" crashes libnftables 1.0.6.
        out = self.shared.run(f"list table netdev {self.table}\n")
        self.shared.run(f"delete table netdev {self.table}\n")
        seen, dropped = parse_loss_counters(out)
        self.rec.actual_end_ns = time.time_ns()
        self.rec.seen_packets, self.rec.dropped_packets = seen, dropped
