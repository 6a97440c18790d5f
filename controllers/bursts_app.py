"""The bursts app: the routing app plus the burst lifecycle (schedule, start, end, record).

A burst starts on a round event, at a time after the arm's first round, or
on request, and ends after its rounds (capped at ``max_ms``) or its
duration. Mechanisms: ``loss`` an nftables rule (``controllers.mechanisms``),
``police`` OpenFlow 1.3 meters on the target's flows, ``congest`` cross
traffic from agents in other hosts along a path found through the routing
rules. Each burst's actual start and end and the packets it dropped go to
its unit's ``raw/ARM/seed-SEED/bursts.jsonl`` as a
``controllers.bursts.BurstRecord``.

State is kept per unit, (arm, seed) as the round announcements name it:
the runner trains every arm once per seed, and each of those units meets
the whole schedule, its at_s bursts timed from its own first round.
"""
from __future__ import annotations

import json
import os
import threading
import time

from controllers.bursts import BurstError, BurstRecord, BurstSchedule
from controllers.compat import MAIN_DISPATCHER, hub, ofp_event, set_ev_cls
from controllers.mechanisms import NFT_PREFIX, CrossAgent, LossBurst, Nft, pfifo_drops
from controllers.protocol import (
    BurstReply,
    BurstRequest,
    ErrorReply,
    Reply,
    RoundReply,
    RoundRequest,
    ScheduleReply,
    ScheduleRequest,
)
from controllers.routing_app import FabricRouting
from controllers.targets import TargetError, resolve_target
from topologies import trace_path
from topologies.routing import multipath_bits

COOKIE_POLICE = 0x2 << 32


def _seed_tag(rec) -> str:
    """``s<seed>_`` in a mechanism's name, so two units' bursts of one id never share one."""
    return "" if rec.seed is None else f"s{rec.seed}_"


class FabricBursts(FabricRouting):

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.schedule = BurstSchedule.from_dict(self.cfg.get("bursts"))
        self.active = {}         # (arm, seed, burst id) -> (BurstRecord, mechanism state)
        self.done = []
        self.arm_t0 = {}         # (arm, seed) -> first round event t_ns (origin of at_s)
        self.nft = Nft()
        self.next_meter = 1
        self.seq = 0
        self.agents = {}         # host -> CrossAgent (congest sources)
        self.agents_lock = threading.Lock()
        self.logger.info("fabric controller: %s, %d switches, %d hosts, %d bursts scheduled, "
                         "nft %s", self.topo.name, len(self.topo.switches()),
                         len(self.topo.hosts()), len(self.schedule),
                         "in-process" if self.nft.in_process else "via nft(8)")
        hub.spawn(self._prestart_agents)

    def control_handlers(self) -> dict:
        return {**super().control_handlers(), RoundRequest: self.round_request,
                BurstRequest: self.burst_request, ScheduleRequest: self.schedule_request}

    def status_fields(self) -> dict:
        return {**super().status_fields(), "active_bursts": [r.spec.id for r, _ in self.active.values()],
                "bursts_done": len(self.done), "scheduled": len(self.schedule)}

    def switch_reconnected(self, dp):
        super().switch_reconnected(dp)
        for rec, mech in list(self.active.values()):
            if rec.spec.kind == "police":
                hub.spawn(self._police_apply, rec, mech, only_dpid=dp.id)

    @set_ev_cls(ofp_event.EventOFPMeterStatsReply, MAIN_DISPATCHER)
    def meter_stats_reply_handler(self, ev):
        self._wake(ev.msg)

    # ------------------------------------------------------------------ requests
    def schedule_request(self, req: ScheduleRequest) -> ScheduleReply:
        self.schedule = req.schedule()
        return ScheduleReply(scheduled=len(self.schedule))

    def round_request(self, req: RoundRequest) -> RoundReply:
        arm, seed, rnd = req.arm, req.seed, req.round
        unit = (arm, seed)
        t_ns = time.time_ns() if req.t_ns is None else req.t_ns
        if unit not in self.arm_t0:
            self.arm_t0[unit] = t_ns
            for spec in self.schedule.timed():
                at = t_ns + int(spec.at_s * 1e9)
                hub.spawn_after(max(0.0, (at - time.time_ns()) / 1e9), self._start_timed, spec,
                                unit, at)
        if req.event == "start":
            # a round-length burst whose end event never came ends now
            for key, (rec, _) in list(self.active.items()):
                if (rec.arm, rec.seed) == unit and rec.spec.rounds is not None \
                        and rnd > rec.spec.last_round:
                    self._end(key, t_ns)
            for spec in self.schedule.starting_at_round(rnd):
                key = (arm, seed, spec.id)
                if key not in self.active and not any(
                        (r.arm, r.seed, r.spec.id) == key for r in self.done):
                    rec = BurstRecord(spec, arm, requested_start_ns=t_ns, seed=seed, round=rnd)
                    if spec.rounds:
                        end = t_ns + int(spec.max_ms * 1e6) if spec.max_ms else None
                    else:
                        end = t_ns + int(spec.duration_ms * 1e6)
                    self._start(key, rec, end_at_ns=end)
        else:
            for spec in self.schedule.ending_after_round(rnd):
                key = (arm, seed, spec.id)
                if key in self.active:
                    self._end(key, t_ns)
        return RoundReply(active_bursts=[r.spec.id for r, _ in self.active.values()
                                         if (r.arm, r.seed) == unit])

    def burst_request(self, req: BurstRequest) -> Reply:
        self.seq += 1
        spec = req.burst(f"m{self.seq:03d}")
        now = time.time_ns()
        key = (req.arm, None, spec.id)
        if key in self.active:
            raise ValueError(f"burst id {spec.id!r} is already active")
        rec = BurstRecord(spec, req.arm, requested_start_ns=now)
        self._start(key, rec, end_at_ns=now + int(spec.duration_ms * 1e6))
        if rec.error:
            return ErrorReply(error=rec.error, id=spec.id)
        return BurstReply(id=spec.id, actual_start_ns=rec.actual_start_ns,
                          requested_start_ns=rec.requested_start_ns,
                          requested_end_ns=rec.requested_end_ns)

    def _start_timed(self, spec, unit, at_ns):
        arm, seed = unit
        with self.lock:
            try:
                if (arm, seed, spec.id) not in self.active:
                    rec = BurstRecord(spec, arm, requested_start_ns=at_ns, seed=seed)
                    self._start((arm, seed, spec.id), rec,
                                end_at_ns=at_ns + int(spec.duration_ms * 1e6))
            except Exception:
                self.logger.exception("timed burst %s failed", spec.id)

    # ------------------------------------------------------------------ lifecycle
    def _start(self, key, rec, end_at_ns):
        """Switch the mechanism on now; schedule its end if it has a duration."""
        spec = rec.spec
        rec.requested_end_ns = end_at_ns
        try:
            ports = resolve_target(self.topo, spec.target, self.roles)
            if spec.kind == "loss":
                mech = LossBurst(self.nft, f"{rec.arm}_{_seed_tag(rec)}{spec.id}", self.topo, ports,
                                 spec.params["p"], self.cfg.get("loss_sink", "dtz0-eth0"),
                                 self.cfg.get("nft_prefix", NFT_PREFIX))
                mech.on()
            elif spec.kind == "police":
                mech = self._police_start(rec, ports)
            else:
                mech = self._congest_start(rec, ports)
            rec.actual_start_ns = mech.get("t_go") if isinstance(mech, dict) and mech.get("t_go") \
                else time.time_ns()
        except Exception as e:
            rec.error = f"{type(e).__name__}: {e}"
            self.logger.error("burst %s failed to start: %s", spec.id, rec.error)
            rec.actual_start_ns = rec.actual_end_ns = None
            self._log_burst(rec)
            if isinstance(e, (TargetError, BurstError, ValueError)):
                raise
            return
        self.active[key] = (rec, mech)
        self.logger.info("burst %s (%s on %s, arm %s) on, lag %.2f ms", spec.id, spec.kind,
                         spec.target, rec.arm, (rec.actual_start_ns - rec.requested_start_ns) / 1e6)
        if end_at_ns is not None:
            hub.spawn_after(max(0.0, (end_at_ns - time.time_ns()) / 1e9), self._end, key, end_at_ns)

    def _end(self, key, requested_end_ns):
        with self.lock:
            self._end_locked(key, requested_end_ns)

    def _end_locked(self, key, requested_end_ns):
        item = self.active.pop(key, None)
        if item is None:
            return
        rec, mech = item
        rec.requested_end_ns = requested_end_ns
        try:
            if rec.spec.kind == "loss":
                seen, dropped = mech.off()
                rec.actual_end_ns = time.time_ns()
                rec.seen_packets, rec.dropped_packets = seen, dropped
            elif rec.spec.kind == "police":
                self._police_end(rec, mech)
            else:
                self._congest_end(rec, mech)
        except Exception as e:
            rec.error = f"{type(e).__name__}: {e}"
            rec.actual_end_ns = rec.actual_end_ns or time.time_ns()
            self.logger.exception("burst %s failed to end cleanly", rec.spec.id)
        self.done.append(rec)
        self.logger.info("burst %s off, dropped %s", rec.spec.id, rec.dropped_packets)
        self._log_burst(rec)

    def _log_burst(self, rec):
        d = rec.log_dir(self.raw)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "bursts.jsonl"), "a") as f:
            f.write(json.dumps(rec.log_line()) + "\n")

    # ------------------------------------------------------------------ police
    # OpenFlow 1.3 meters with the burst flag on the target's flows.
    def _police_start(self, rec, ports):
        bw = self.cfg.get("bw_mbps") or 100.0
        rate_mbps = rec.spec.params.get("rate_mbps", 0.2 * bw)
        # bucket: 10 ms of rate, at least ~1.3 MTU frames (measured: 10 kbit at 2 Mbit/s
        # over-drops by 3-7 points, 20 kbit matches 1 - rate/offered within 1 point)
        burst_kb = rec.spec.params.get("burst_kb", max(16, int(rate_mbps * 1000 * 0.01)))
        mech = {"ports": ports, "rate_kbps": int(rate_mbps * 1000), "burst_kb": int(burst_kb),
                "meters": {}}
        for tp in ports:
            mech["meters"][(tp.switch, tp.port, tp.direction)] = self.next_meter
            self.next_meter += 1
        self._police_apply(rec, mech)
        return mech

    def _police_apply(self, rec, mech, only_dpid=None):
        touched = []
        for tp in mech["ports"]:
            dpid = self.topo.dpid_of(tp.switch)
            if only_dpid is not None and dpid != only_dpid:
                continue
            dp = self.datapaths.get(dpid)
            if dp is None:
                raise RuntimeError(f"switch {tp.switch} not connected")
            ofp, parser = dp.ofproto, dp.ofproto_parser
            mid = mech["meters"][(tp.switch, tp.port, tp.direction)]
            band = parser.OFPMeterBandDrop(rate=mech["rate_kbps"], burst_size=mech["burst_kb"])
            dp.send_msg(parser.OFPMeterMod(
                datapath=dp, command=ofp.OFPMC_ADD,
                flags=ofp.OFPMF_KBPS | ofp.OFPMF_BURST | ofp.OFPMF_STATS, meter_id=mid, bands=[band]))
            for r in self.rules[tp.switch]:
                if tp.direction == "egress" and r.out_port == tp.port:
                    self.add_flow(dp, r.priority, parser.OFPMatch(**r.match_dict()),
                                  [parser.OFPActionOutput(r.out_port)], meter_id=mid,
                                  command=ofp.OFPFC_MODIFY_STRICT)
                elif tp.direction == "ingress" and r.out_port != tp.port:
                    self.add_flow(dp, r.priority + 1000,
                                  parser.OFPMatch(in_port=tp.port, **r.match_dict()),
                                  [parser.OFPActionOutput(r.out_port)], meter_id=mid,
                                  cookie=COOKIE_POLICE | mid)
            touched.append(dp)
        for dp in {id(d): d for d in touched}.values():
            self._barrier_wait(dp)

    def _police_meters(self, mech):
        """(target port, its connected datapath, meter id) of a police burst."""
        for tp in mech["ports"]:
            dp = self.datapaths.get(self.topo.dpid_of(tp.switch))
            if dp is not None:
                yield tp, dp, mech["meters"][(tp.switch, tp.port, tp.direction)]

    def _police_end(self, rec, mech):
        dps = {}
        for tp, dp, mid in self._police_meters(mech):
            ofp, parser = dp.ofproto, dp.ofproto_parser
            if tp.direction == "egress":
                for r in self.rules[tp.switch]:
                    if r.out_port == tp.port:
                        self.add_flow(dp, r.priority, parser.OFPMatch(**r.match_dict()),
                                      [parser.OFPActionOutput(r.out_port)],
                                      command=ofp.OFPFC_MODIFY_STRICT)
            else:
                dp.send_msg(parser.OFPFlowMod(datapath=dp, command=ofp.OFPFC_DELETE,
                                              table_id=ofp.OFPTT_ALL, cookie=COOKIE_POLICE | mid,
                                              cookie_mask=0xffffffffffffffff,
                                              out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY))
            dps[dp.id] = dp
        for dp in dps.values():
            self._barrier_wait(dp)
        rec.actual_end_ns = time.time_ns()
        dropped = seen = 0
        for _tp, dp, mid in self._police_meters(mech):
            ofp, parser = dp.ofproto, dp.ofproto_parser
            reply = self._request(dp, parser.OFPMeterStatsRequest(dp, 0, mid))
            for st in (reply.body if reply is not None else []):
                if st.meter_id == mid:
                    seen += st.packet_in_count
                    dropped += sum(b.packet_band_count for b in st.band_stats)
            dp.send_msg(parser.OFPMeterMod(datapath=dp, command=ofp.OFPMC_DELETE, flags=0,
                                           meter_id=mid))
        rec.dropped_packets, rec.seen_packets = dropped, seen
        rec.detail = {"rate_kbps": mech["rate_kbps"], "burst_kb": mech["burst_kb"]}

    # ------------------------------------------------------------------ congest
    # Cross traffic into the target's bounded queue.
    def _congest_start(self, rec, ports):
        if any(tp.direction != "egress" for tp in ports):
            raise ValueError(f"congest needs an egress target (a downlink, core-uplinks or "
                             f"SWITCH:NEIGHBOUR), not {rec.spec.target!r}")
        bw = self.cfg.get("bw_mbps") or 100.0
        rate = rec.spec.params.get("rate_mbps", 2.0 * bw)
        size = rec.spec.params["pkt_bytes"]
        busy = {self.roles.get("server")} | set(self.roles.get("workers", []))
        # each source's own link is shaped to bw: enough sources to exceed it
        n_src = max(1, int(-(-rate // (0.8 * bw))))
        flows, used = [], set()
        for tp in ports:
            for _ in range(n_src):
                flows.append(self._cross_flow(tp, busy, used))
                used.add(flows[-1][0])
        rate = rate / n_src
        before = {tp.intf: pfifo_drops(tp.intf) for tp in ports}
        started = []
        for i, (src, dst, sport) in enumerate(flows):
            agent = self._agent(src)
            fid = f"{rec.arm}.{_seed_tag(rec)}{rec.spec.id}.{i}"
            agent.start(fid, self.topo.host_info[dst].ip, sport, rate, size)
            started.append((agent, fid))
        t_go = [agent.wait_for("go", fid) for agent, fid in started]
        if any(t is None for t in t_go):
            for agent, fid in started:
                agent.stop(fid)
            raise RuntimeError("a cross-traffic agent did not start its flow")
        return {"started": started, "before": before, "ports": ports, "flows": flows,
                "rate_mbps": rate, "t_go": max(t_go)}

    def _agent(self, host):
        with self.agents_lock:
            a = self.agents.get(host)
            if a is None or not a.alive():
                root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                a = CrossAgent(host, self.cfg["host_pids"][host], self.cfg.get("python", "python3"),
                               root)
                self.agents[host] = a
            return a

    def _prestart_agents(self):
        """Agents on the cross-traffic hosts, ready before the first `congest` burst."""
        for h in self.roles.get("cross", [])[:4]:
            try:
                self._agent(h)
            except Exception:
                self.logger.exception("cross-traffic agent on %s failed to start", h)

    def _cross_flow(self, tp, busy, used=()):
        """(src, dst, sport) whose path leaves ``tp.switch`` by ``tp.port``; a fresh src if any."""
        cross = list(self.roles.get("cross", []))
        others = [h for h in self.topo.hosts() if h not in busy and h not in cross]
        sources = cross + others + sorted(busy - {None})
        sources = [h for h in sources if h not in used] + [h for h in sources if h in used]
        neighbour, _ = self.topo.ports(tp.switch)[tp.port]
        dsts = [neighbour] if not self.topo.isSwitch(neighbour) else \
            [h for h in self.topo.hosts() if h not in busy] + sorted(busy - {None})
        m = max(1, multipath_bits(self.topo))
        for dst in dsts:
            for src in sources:
                if src == dst:
                    continue
                for v in range(1 << m):
                    sport = 20000 + v
                    path = trace_path(self.topo, self.rules, src, dst, proto="udp", sport=sport, dport=9)
                    if (tp.switch, tp.port) in path:
                        return src, dst, sport
        raise ValueError(f"no host pair sends through {tp.intf}")

    def _congest_end(self, rec, mech):
        for agent, fid in mech["started"]:
            agent.stop(fid)
        sent = [agent.wait_for("sent", fid) for agent, fid in mech["started"]]
        rec.actual_end_ns = time.time_ns()
        time.sleep(0.05)  # let the queue drain before reading its counters
        rec.dropped_packets = sum(pfifo_drops(tp.intf) - mech["before"][tp.intf]
                                  for tp in mech["ports"])
        rec.detail = {"cross_flows": [list(f) for f in mech["flows"]],
                      "rate_mbps_per_flow": mech["rate_mbps"], "cross_packets_sent": sent}

    def close(self):
        for key in list(self.active):
            try:
                self._end(key, time.time_ns())
            except Exception:
                self.logger.exception("burst %s did not end at shutdown", key[-1])
        for a in list(self.agents.values()):
            a.close()
        super().close()
