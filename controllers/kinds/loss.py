"""``loss``: random drop on the target's ports by an nftables rule (``controllers.mechanisms``)."""
from __future__ import annotations

import time

from controllers.kinds.base import BurstKind, Choice, P, Param
from controllers.mechanisms import (
    NFT_PREFIX,
    NftPool,
    loss_hooks,
    loss_script,
    loss_table_name,
    parse_loss_counters,
)
from controllers.traffic import TRAFFIC


class LossKind(BurstKind):
    """A netdev table that steals each packet leaving the target with probability p.

    Off reads the table's counters: what crossed the hooks (seen) and what
    was stolen (dropped). In a fabric across machines each machine holding a
    hooked port gets its own table with its own hooks (`NftPool`), and the
    counters are summed.
    """

    name = "loss"
    params = {"p": Param(P, 0.8, "drop probability of each packet leaving the target"),
              "traffic": Param(Choice(TRAFFIC), None,
                               "which packets it may drop: all (default), the transport's data "
                               "(DATA datagrams) or its control path (controllers.traffic)")}
    doc = "nftables egress rule stealing each packet with probability p"

    @classmethod
    def open(cls, app) -> NftPool:
        """The nft contexts every loss burst of the controller shares (in-process when it can be)."""
        pool = NftPool(app.cfg.get("remote"))
        pool.start_all()
        app.logger.info("loss bursts: nft %s", "in-process" if pool.in_process else "via nft(8)")
        return pool

    @classmethod
    def close(cls, app, shared: NftPool) -> None:
        shared.close()

    def __init__(self, app, rec, ports, shared: NftPool | None = None):
        super().__init__(app, rec, ports, shared if shared is not None else NftPool(app.cfg.get("remote")))
        self.table = loss_table_name(self.tag(), app.cfg.get("nft_prefix", NFT_PREFIX))
        self.sink = app.cfg.get("loss_sink", "dtz0-eth0")
        self.hooks: dict = {}  # server (None: this machine) -> its hooks
        for hook in loss_hooks(app.topo, self.ports):
            self.hooks.setdefault(self.shared.server_of(hook[0]), []).append(hook)

    def start(self) -> None:
        for server, hooks in self.hooks.items():
            self.shared.get(server).run(loss_script(self.table, hooks, self.spec.params["p"],
                                                    self.sink,
                                                    self.spec.params.get("traffic", "all")))
        return None

    def stop(self) -> None:
        seen = dropped = 0
        for server in self.hooks:
            nft = self.shared.get(server)
            # Two calls: one buffer with "list" then "delete" crashes libnftables 1.0.6.
            out = nft.run(f"list table netdev {self.table}\n")
            nft.run(f"delete table netdev {self.table}\n")
            s, d = parse_loss_counters(out)
            seen, dropped = seen + s, dropped + d
        self.rec.actual_end_ns = time.time_ns()
        self.rec.seen_packets, self.rec.dropped_packets = seen, dropped
