"""``congest``: cross traffic overflowing the target's bounded queue."""
from __future__ import annotations

import os
import threading
import time

from controllers.kinds.base import BurstKind, Param, Range
from controllers.mechanisms import CrossAgent, NftPool, pfifo_drops
from topologies import trace_path
from topologies.routing import multipath_bits

#: Cross-traffic hosts whose agents start with the controller.
PRESTART_AGENTS = 4


class CrossAgents:
    """The controller's cross-traffic agents, one per source host, started on first use."""

    def __init__(self, app):
        self.app = app
        self.agents: dict[str, CrossAgent] = {}
        self.lock = threading.Lock()
        # The other servers' ports' queues are read there (a fabric across machines).
        self.servers = NftPool(app.cfg.get("remote"))

    def drops(self, intf: str) -> int:
        """The drops of ``intf``'s bounded queue, read on the server that holds it."""
        server = self.servers.server_of(intf)
        return pfifo_drops(intf, None if server is None else self.servers.get(server))

    def get(self, host: str) -> CrossAgent:
        with self.lock:
            a = self.agents.get(host)
            if a is None or not a.alive():
                root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                remote = self.app.cfg.get("remote") or {}
                a = CrossAgent(host, self.app.cfg["host_pids"][host],
                               self.app.cfg.get("python", "python3"), root,
                               argv=remote.get("cross_agents", {}).get(host))
                self.agents[host] = a
            return a

    def prestart(self) -> None:
        """Agents on the cross-traffic hosts, ready before the first `congest` burst."""
        for h in self.app.roles.get("cross", [])[:PRESTART_AGENTS]:
            try:
                self.get(h)
            except Exception:
                self.app.logger.exception("cross-traffic agent on %s failed to start", h)

    def close(self) -> None:
        for a in list(self.agents.values()):
            a.close()
        self.servers.close()


class CongestKind(BurstKind):
    """Paced UDP flows from other hosts whose paths leave by the target's ports.

    Enough sources to exceed the link (each source's own link is shaped to
    it); the dropped packets are what the target ports' drop-tail queues
    counted during the burst.
    """

    name = "congest"
    params = {
        "rate_mbps": Param(Range(0.01, 100_000, "use a cross rate of 0.01..100000 Mbit/s"), None,
                           "cross-traffic rate (default twice the link rate)"),
        "pkt_bytes": Param(Range(64, 1472, "use 64..1472 byte datagrams", integer=True), 1400,
                           "cross-traffic datagram size")}
    doc = "cross traffic overflowing the target's bounded queue"

    @classmethod
    def open(cls, app) -> CrossAgents:
        agents = CrossAgents(app)
        app.spawn(agents.prestart)
        return agents

    @classmethod
    def close(cls, app, shared: CrossAgents) -> None:
        shared.close()

    def __init__(self, app, rec, ports, shared: CrossAgents | None = None):
        super().__init__(app, rec, ports, shared if shared is not None else CrossAgents(app))
        if any(tp.direction != "egress" for tp in self.ports):
            raise ValueError(f"congest needs an egress target (a downlink, core-uplinks or "
                             f"SWITCH:NEIGHBOUR), not {rec.spec.target!r}")

    def start(self) -> int:
        app = self.app
        bw = app.cfg.get("bw_mbps") or 100.0
        rate = self.spec.params.get("rate_mbps", 2.0 * bw)
        size = self.spec.params["pkt_bytes"]
        busy = {app.roles.get("server")} | set(app.roles.get("workers", []))
        # each source's own link is shaped to bw: enough sources to exceed it
        n_src = max(1, int(-(-rate // (0.8 * bw))))
        flows: list[tuple[str, str, int]] = []
        used: set[str] = set()
        for tp in self.ports:
            for _ in range(n_src):
                flows.append(self._cross_flow(tp, busy, used))
                used.add(flows[-1][0])
        rate = rate / n_src
        self.before = {tp.intf: self.shared.drops(tp.intf) for tp in self.ports}
        started = []
        for i, (src, dst, sport) in enumerate(flows):
            agent = self.shared.get(src)
            fid = f"{self.tag('.')}.{i}"
            agent.start(fid, app.topo.host_info[dst].ip, sport, rate, size)
            started.append((agent, fid))
        t_go = [agent.wait_for("go", fid) for agent, fid in started]
        if any(t is None for t in t_go):
            for agent, fid in started:
                agent.stop(fid)
            raise RuntimeError("a cross-traffic agent did not start its flow")
        self.started, self.flows, self.rate_mbps = started, flows, rate
        return max(t_go)

    def _cross_flow(self, tp, busy, used=()):
        """(src, dst, sport) whose path leaves ``tp.switch`` by ``tp.port``; a fresh src if any."""
        topo, roles = self.app.topo, self.app.roles
        cross = list(roles.get("cross", []))
        others = [h for h in topo.hosts() if h not in busy and h not in cross]
        sources = cross + others + sorted(busy - {None})
        sources = [h for h in sources if h not in used] + [h for h in sources if h in used]
        neighbour, _ = topo.ports(tp.switch)[tp.port]
        dsts = [neighbour] if not topo.isSwitch(neighbour) else \
            [h for h in topo.hosts() if h not in busy] + sorted(busy - {None})
        m = max(1, multipath_bits(topo))
        for dst in dsts:
            for src in sources:
                if src == dst:
                    continue
                for v in range(1 << m):
                    sport = 20000 + v
                    path = trace_path(topo, self.app.rules, src, dst, proto="udp", sport=sport,
                                      dport=9)
                    if (tp.switch, tp.port) in path:
                        return src, dst, sport
        raise ValueError(f"no host pair sends through {tp.intf}")

    def stop(self) -> None:
        rec = self.rec
        for agent, fid in self.started:
            agent.stop(fid)
        sent = [agent.wait_for("sent", fid) for agent, fid in self.started]
        rec.actual_end_ns = time.time_ns()
        time.sleep(0.05)  # let the queue drain before reading its counters
        rec.dropped_packets = sum(self.shared.drops(tp.intf) - self.before[tp.intf] for tp in self.ports)
        rec.detail = {"cross_flows": [list(f) for f in self.flows],
                      "rate_mbps_per_flow": self.rate_mbps, "cross_packets_sent": sent}
