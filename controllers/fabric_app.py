"""The fabric controller: proactive multipath routes, burst injection, a control socket.

Written in Ryu's own style (simple_switch_13 / simple_monitor_13):
``OFP_VERSIONS``, ``@set_ev_cls`` handlers named after their event, one
``add_flow`` helper, state keyed by DPID, periodic work on the hub. Routing
is computed by ``topologies.routing`` (plain functions) and installed when a
switch connects, before any host speaks; a reconnecting switch gets its
flows again (and any active ``police`` burst re-applied). Nothing is flooded
and no MAC is learnt: ARP is routed by target address like IP.

The configuration (topology, socket path, run dir, bursts) comes from the
JSON file named by env ``DBLP_FABRIC_CONFIG``; ``controllers.run`` sets it.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

from controllers.compat import (BaseApp, CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER,
                                hub, ofp_event, ofproto_v1_3, set_ev_cls)
from controllers.bursts import BurstError, BurstRecord, BurstSchedule, BurstSpec
from controllers.mechanisms import CrossAgent, LossBurst, Nft, pfifo_drops
from controllers.targets import TargetError, resolve_target
from topologies import TopoGraph, compute_rules, trace_path
from topologies.routing import multipath_bits

COOKIE_ROUTE = 0x1
COOKIE_POLICE = 0x2 << 32


class FabricController(BaseApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        with open(os.environ["DBLP_FABRIC_CONFIG"]) as f:
            self.cfg = json.load(f)
        self.topo = TopoGraph.from_dict(self.cfg["topology"])
        self.roles = dict(self.topo.roles, **(self.cfg.get("roles") or {}))
        self.rules = compute_rules(self.topo)
        self.run_dir = self.cfg["run_dir"]
        self.raw = os.path.join(self.run_dir, "raw")
        os.makedirs(self.raw, exist_ok=True)
        self.datapaths = {}      # dpid -> datapath
        self.sw_state = {}       # dpid -> {"connected", "routed", "flows", "connects"}
        self.waiters = {}        # xid -> [hub.Event, reply]
        self.schedule = BurstSchedule(self.cfg.get("bursts") or [])
        self.active = {}         # key -> (BurstRecord, mechanism state)
        self.done = []
        self.arm_t0 = {}         # arm -> first round event t_ns (origin of at_s)
        self.nft = Nft()
        self.next_meter = 1
        self.seq = 0
        self.lock = threading.RLock()  # bursts start/end from socket and timer threads
        self.logger.info("fabric controller: %s, %d switches, %d hosts, %d bursts scheduled, "
                         "nft %s", self.topo.name, len(self.topo.switches()),
                         len(self.topo.hosts()), len(self.schedule),
                         "in-process" if self.nft.in_process else "via nft(8)")
        self.sock_path = self.cfg["control_socket"]
        self.agents = {}         # host -> CrossAgent (congest sources)
        self.agents_lock = threading.Lock()
        hub.spawn(self._serve_control)
        hub.spawn(self._prestart_agents)
        self.monitor_s = float(self.cfg.get("monitor_s") or 0)
        self.port_stats = {}     # dpid -> {port: counters} (latest reply)
        if self.monitor_s > 0:
            hub.spawn(self._monitor)

    # ------------------------------------------------------------------ OpenFlow
    def add_flow(self, datapath, priority, match, actions, meter_id=None, cookie=COOKIE_ROUTE,
                 command=None):
        ofp, parser = datapath.ofproto, datapath.ofproto_parser
        inst = []
        if meter_id is not None:
            inst.append(parser.OFPInstructionMeter(meter_id, ofp.OFPIT_METER))
        inst.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions))
        mod = parser.OFPFlowMod(datapath=datapath, priority=priority, match=match,
                                instructions=inst, cookie=cookie,
                                command=ofp.OFPFC_ADD if command is None else command)
        datapath.send_msg(mod)

    def _install_routes(self, dp):
        ofp, parser = dp.ofproto, dp.ofproto_parser
        name = self.topo.switch_by_dpid(dp.id)
        # start from an empty table: a reconnecting switch may hold stale flows
        dp.send_msg(parser.OFPFlowMod(datapath=dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY))
        dp.send_msg(parser.OFPMeterMod(datapath=dp, command=ofp.OFPMC_DELETE, flags=0,
                                       meter_id=ofp.OFPM_ALL))
        for r in self.rules[name]:
            self.add_flow(dp, r.priority, parser.OFPMatch(**r.match_dict()),
                          [parser.OFPActionOutput(r.out_port)])
        self.sw_state[dp.id]["flows"] = len(self.rules[name])
        xid = self._send_barrier(dp)
        self.sw_state[dp.id]["barrier_xid"] = xid

    def _send_barrier(self, dp):
        msg = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.set_xid(msg)
        dp.send_msg(msg)
        return msg.xid

    def _request(self, dp, msg, timeout=2.0):
        """Send a request and wait (green) for its reply by xid."""
        dp.set_xid(msg)
        ev = threading.Event()  # os-ken's default hub is native threads
        self.waiters[msg.xid] = [ev, None]
        dp.send_msg(msg)
        ev.wait(timeout=timeout)
        return self.waiters.pop(msg.xid, [None, None])[1]

    def _barrier_wait(self, dp, timeout=2.0):
        return self._request(dp, dp.ofproto_parser.OFPBarrierRequest(dp), timeout)

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features_handler(self, ev):
        dp = ev.msg.datapath
        try:
            name = self.topo.switch_by_dpid(dp.id)
        except KeyError:
            self.logger.warning("unknown switch DPID %#x connected; ignoring it", dp.id)
            return
        st = self.sw_state.setdefault(dp.id, {"name": name, "connects": 0})
        st.update(connected=True, routed=False)
        st["connects"] += 1
        self.datapaths[dp.id] = dp
        self._install_routes(dp)
        self.logger.info("switch %s (%#x) connected (%d), %d flows sent", name, dp.id,
                         st["connects"], st["flows"])
        if st["connects"] > 1:
            for rec, mech in list(self.active.values()):
                if rec.spec.kind == "police":
                    hub.spawn(self._police_apply, rec, mech, only_dpid=dp.id)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def barrier_reply_handler(self, ev):
        dp = ev.msg.datapath
        st = self.sw_state.get(dp.id)
        if st is not None and st.get("barrier_xid") == ev.msg.xid:
            st["routed"] = True
            st["routed_ns"] = time.time_ns()
        self._wake(ev.msg)

    @set_ev_cls(ofp_event.EventOFPMeterStatsReply, MAIN_DISPATCHER)
    def meter_stats_reply_handler(self, ev):
        self._wake(ev.msg)

    def _monitor(self):
        """Periodic port statistics (simple_monitor_13 style) into raw/port_stats.jsonl.

        Why: the analysis checks every run for drops inside the emulator
        (OVS tx_dropped, errors) next to the achieved vs shaped rate.
        """
        while True:
            hub.sleep(self.monitor_s)
            for dp in list(self.datapaths.values()):
                parser = dp.ofproto_parser
                dp.send_msg(parser.OFPPortStatsRequest(dp, 0, dp.ofproto.OFPP_ANY))

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def port_stats_reply_handler(self, ev):
        dp, t = ev.msg.datapath, time.time_ns()
        name = self.sw_state.get(dp.id, {}).get("name", str(dp.id))
        rows = {}
        for st in ev.msg.body:
            if st.port_no > 0xffffff00:
                continue
            rows[st.port_no] = {"rx_packets": st.rx_packets, "tx_packets": st.tx_packets,
                                "rx_bytes": st.rx_bytes, "tx_bytes": st.tx_bytes,
                                "rx_dropped": st.rx_dropped, "tx_dropped": st.tx_dropped,
                                "tx_errors": st.tx_errors}
        self.port_stats[dp.id] = rows
        with open(os.path.join(self.raw, "port_stats.jsonl"), "a") as f:
            f.write(json.dumps({"event": "port_stats", "t_ns": t, "switch": name, "dpid": dp.id,
                                "ports": rows}) + "\n")
        self._wake(ev.msg)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def error_msg_handler(self, ev):
        m = ev.msg
        self.logger.error("OpenFlow error from %#x: type=%s code=%s", m.datapath.id, m.type, m.code)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def state_change_handler(self, ev):
        dp = ev.datapath
        if ev.state == DEAD_DISPATCHER and dp.id in self.sw_state:
            self.sw_state[dp.id].update(connected=False, routed=False)
            self.datapaths.pop(dp.id, None)
            self.logger.warning("switch %s (%#x) disconnected", self.sw_state[dp.id]["name"], dp.id)

    def _wake(self, msg):
        w = self.waiters.get(msg.xid)
        if w:
            w[1] = msg
            w[0].set()

    # ------------------------------------------------------------------ control socket
    def _serve_control(self):
        path = self.sock_path
        if os.path.exists(path):
            os.unlink(path)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)   # the socket is born 0600: only root (the harness) talks to it
        try:
            srv.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        srv.listen(64)
        self.logger.info("control socket listening at %s", path)
        while True:
            conn, _ = srv.accept()
            hub.spawn(self._handle_client, conn)

    def _handle_client(self, conn):
        buf = b""
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    reply = self.handle_request_line(line)
                    conn.sendall((json.dumps(reply) + "\n").encode())
                if len(buf) > 1 << 20:
                    conn.sendall(b'{"ok": false, "error": "request line longer than 1 MiB"}\n')
                    return
        except OSError:
            return
        finally:
            conn.close()

    def handle_request_line(self, line: bytes) -> dict:
        try:
            req = json.loads(line)
        except ValueError as e:
            return {"ok": False, "error": f"not JSON: {e}"}
        if not isinstance(req, dict):
            return {"ok": False, "error": "request must be a JSON object"}
        op = req.get("op")
        handlers = {"status": self.op_status, "round": self.op_round, "burst": self.op_burst,
                    "schedule": self.op_schedule}
        try:
            if op not in handlers:
                return {"ok": False, "error": f"unknown op {op!r}; use round, burst, status or schedule"}
            with self.lock:
                return handlers[op](req)
        except (BurstError, TargetError, ValueError, TypeError, KeyError) as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        except Exception as e:  # the controller must survive anything a client sends
            self.logger.exception("request %r failed", req)
            return {"ok": False, "error": f"internal error: {type(e).__name__}: {e}"}

    def op_status(self, req=None):
        sw = {str(d): {"name": s["name"], "connected": s.get("connected", False),
                       "routed": s.get("routed", False), "flows": s.get("flows", 0),
                       "connects": s["connects"]} for d, s in self.sw_state.items()}
        n_routed = sum(1 for s in sw.values() if s["routed"])
        return {"ok": True, "topology": self.topo.name, "switches": sw,
                "routed": n_routed, "expected": len(self.topo.switches()),
                "ready": n_routed == len(self.topo.switches()),
                "active_bursts": [r.spec.id for r, _ in self.active.values()],
                "bursts_done": len(self.done), "scheduled": len(self.schedule),
                "multipath_bits": multipath_bits(self.topo), "pid": os.getpid(),
                "monitor_s": self.monitor_s}

    def op_schedule(self, req):
        self.schedule = BurstSchedule(req.get("bursts") or [])
        return {"ok": True, "scheduled": len(self.schedule)}

    def op_round(self, req):
        event, arm, rnd = req.get("event"), req.get("arm"), req.get("round")
        if event not in ("start", "end"):
            raise ValueError(f"event must be 'start' or 'end', got {event!r}")
        if not isinstance(arm, str) or not arm:
            raise ValueError(f"arm must be a non-empty string, got {arm!r}")
        if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
            raise ValueError(f"round must be an integer >= 0, got {rnd!r}")
        t_ns = req.get("t_ns")
        if isinstance(t_ns, bool) or not isinstance(t_ns, int):
            t_ns = time.time_ns()
        if arm not in self.arm_t0:
            self.arm_t0[arm] = t_ns
            for spec in self.schedule.timed():
                at = t_ns + int(spec.at_s * 1e9)
                hub.spawn_after(max(0.0, (at - time.time_ns()) / 1e9), self._start_timed, spec, arm, at)
        if event == "start":
            # a round-length burst whose end event never came ends now
            for key, (rec, _) in list(self.active.items()):
                if rec.arm == arm and rec.spec.rounds is not None and rnd > rec.spec.last_round:
                    self._end(key, t_ns)
            for spec in self.schedule.starting_at_round(rnd):
                key = (arm, spec.id)
                if key not in self.active and not any(
                        r.arm == arm and r.spec.id == spec.id for r in self.done):
                    rec = BurstRecord(spec, arm, requested_start_ns=t_ns, round=rnd)
                    if spec.rounds:
                        end = t_ns + int(spec.max_ms * 1e6) if spec.max_ms else None
                    else:
                        end = t_ns + int(spec.duration_ms * 1e6)
                    self._start(key, rec, end_at_ns=end)
        else:
            for spec in self.schedule.ending_after_round(rnd):
                key = (arm, spec.id)
                if key in self.active:
                    self._end(key, t_ns)
        return {"ok": True, "active_bursts": [r.spec.id for r, _ in self.active.values()
                                              if r.arm == arm]}

    def op_burst(self, req):
        d = {k: req[k] for k in ("kind", "target", "params", "duration_ms") if k in req}
        d["trigger"] = "manual"
        self.seq += 1
        d["id"] = str(req.get("id") or f"m{self.seq:03d}")
        if "duration_ms" not in d:
            raise ValueError("a manual burst needs duration_ms")
        spec = BurstSpec.from_dict(d, where="burst")
        arm = req.get("arm") or "manual"
        if not isinstance(arm, str):
            raise ValueError(f"arm must be a string, got {arm!r}")
        now = time.time_ns()
        key = (arm, spec.id)
        if key in self.active:
            raise ValueError(f"burst id {spec.id!r} is already active")
        rec = BurstRecord(spec, arm, requested_start_ns=now)
        self._start(key, rec, end_at_ns=now + int(spec.duration_ms * 1e6))
        if rec.error:
            return {"ok": False, "error": rec.error, "id": spec.id}
        return {"ok": True, "id": spec.id, "actual_start_ns": rec.actual_start_ns,
                "requested_start_ns": rec.requested_start_ns,
                "requested_end_ns": rec.requested_end_ns}

    def _start_timed(self, spec, arm, at_ns):
        with self.lock:
            try:
                self._start_timed_locked(spec, arm, at_ns)
            except Exception:
                self.logger.exception("timed burst %s failed", spec.id)

    def _start_timed_locked(self, spec, arm, at_ns):
        key = (arm, spec.id)
        if key in self.active:
            return
        rec = BurstRecord(spec, arm, requested_start_ns=at_ns)
        self._start(key, rec, end_at_ns=at_ns + int(spec.duration_ms * 1e6))

    # ------------------------------------------------------------------ bursts
    def _start(self, key, rec, end_at_ns):
        """Switch the mechanism on now; schedule its end if it has a duration."""
        spec = rec.spec
        rec.requested_end_ns = end_at_ns
        try:
            ports = resolve_target(self.topo, spec.target, self.roles)
            if spec.kind == "loss":
                mech = LossBurst(self.nft, f"{rec.arm}_{spec.id}", self.topo, ports,
                                 spec.params["p"], self.cfg.get("loss_sink", "dtz0-eth0"))
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
        d = os.path.join(self.raw, rec.arm)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "bursts.jsonl"), "a") as f:
            f.write(json.dumps(rec.log_line()) + "\n")

    # police: OpenFlow 1.3 meters with the burst flag on the target's flows
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
        for tp, dp, mid in self._police_meters(mech):
            parser = dp.ofproto_parser
            reply = self._request(dp, parser.OFPMeterStatsRequest(dp, 0, mid))
            for st in (reply.body if reply is not None else []):
                if st.meter_id == mid:
                    seen += st.packet_in_count
                    dropped += sum(b.packet_band_count for b in st.band_stats)
            dp.send_msg(parser.OFPMeterMod(datapath=dp, command=ofp.OFPMC_DELETE, flags=0,
                                           meter_id=mid))
        rec.dropped_packets, rec.seen_packets = dropped, seen
        rec.detail = {"rate_kbps": mech["rate_kbps"], "burst_kb": mech["burst_kb"]}

    # congest: cross-traffic into the target's bounded queue
    def _congest_start(self, rec, ports):
        if any(tp.direction != "egress" for tp in ports):
            raise ValueError(f"congest needs an egress target (a downlink, core-uplinks or "
                             f"SWITCH:NEIGHBOUR), not {rec.spec.target!r}")
        bw = self.cfg.get("bw_mbps") or 100.0
        rate = rec.spec.params.get("rate_mbps", 2.0 * bw)
        size = rec.spec.params.get("pkt_bytes", 1400)
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
            fid = f"{rec.arm}.{rec.spec.id}.{i}"
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
                pass
        for a in list(self.agents.values()):
            a.close()
        try:
            os.unlink(self.sock_path)
        except OSError:
            pass
