"""The routing app: proactive multipath routes and ARP, confirmed by a barrier, and the control socket.

Written in Ryu's own style (``simple_switch_13``): ``OFP_VERSIONS``,
``@set_ev_cls`` handlers named after their event, one ``add_flow`` helper,
state keyed by DPID. Routing is computed by ``topologies.routing`` (plain
functions tests call without a switch) and installed when a switch
connects, before any host speaks; a reconnecting switch gets its flows
again. Nothing is flooded and no MAC is learnt: ARP is routed by target
address like IP. The burst and port-monitor apps extend this class the way
``simple_monitor_13`` extends ``simple_switch_13``; ``controllers.fabric_app``
composes them.

The configuration (topology, socket path, run dir, bursts) comes from the
JSON file named by env ``DBLP_FABRIC_CONFIG``; ``controllers.run`` sets it.

Nothing unauthenticated programs a switch: a connection is accepted only
from the switches' own side (``controllers.ofchannel``: a local socket of
root's or OVS's user, or one of the fabric's other servers), a DPID that is
already connected is refused to a second connection (the first keeps the
switch; when the refused one leaves, the switch's entry stays), and a reply
counts only on the connection that asked for it, by (DPID, xid) (an
unsolicited ``PortStatsReply`` is never written). A switch that really
reconnects closes its old connection first; if its new one arrives before
the old one's end is seen, it is refused once and OVS retries.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

from controllers.compat import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    BaseApp,
    hub,
    ofp_event,
    ofproto_v1_3,
    set_ev_cls,
)
from controllers.control_server import ControlServer
from controllers.ofchannel import PeerPolicy
from controllers.protocol import StatusReply, StatusRequest, SwitchStatus
from topologies import TopoGraph, compute_rules
from topologies.routing import multipath_bits

COOKIE_ROUTE = 0x1


class FabricRouting(BaseApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        with open(os.environ["DBLP_FABRIC_CONFIG"]) as f:
            self.cfg = json.load(f)
        self.topo = TopoGraph.from_dict(self.cfg["topology"])
        self.roles = dict(self.topo.roles, **(self.cfg.get("roles") or {}))
        self.rules = compute_rules(self.topo)
        self.raw = os.path.join(self.cfg["run_dir"], "raw")
        os.makedirs(self.raw, exist_ok=True)
        self.datapaths = {}      # dpid -> datapath
        self.sw_state = {}       # dpid -> {"name", "connected", "routed", "flows", "connects"}
        self.waiters = {}        # (dpid, xid) -> [threading.Event, reply, the datapath asked]
        self.peers = PeerPolicy.from_config(self.cfg)
        self.lock = threading.RLock()  # control requests and burst timers share the state
        self.control = ControlServer(self.cfg["control_socket"], self.control_handlers(), self.lock,
                                     spawn=hub.spawn, logger=self.logger)

    def start(self):
        """After every app's ``__init__``: only then may requests reach the handlers."""
        super().start()
        self.threads.append(hub.spawn(self.control.serve_forever))

    def control_handlers(self) -> dict:
        """Request class -> handler; each app adds its own (``super()`` first)."""
        return {StatusRequest: self.status_request}

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
        """Send a request and wait for its reply: the one with its xid from this very connection."""
        dp.set_xid(msg)
        ev = threading.Event()  # os-ken's default hub is native threads
        key = (dp.id, msg.xid)
        self.waiters[key] = [ev, None, dp]
        dp.send_msg(msg)
        ev.wait(timeout=timeout)
        return self.waiters.pop(key, [None, None, None])[1]

    def _barrier_wait(self, dp, timeout=2.0):
        return self._request(dp, dp.ofproto_parser.OFPBarrierRequest(dp), timeout)

    def _wake(self, msg):
        w = self.waiters.get((msg.datapath.id, msg.xid))
        if w and w[2] is msg.datapath:
            w[1] = msg
            w[0].set()

    def is_current(self, dp) -> bool:
        """Whether ``dp`` is the connection the controller keeps for its DPID (not a refused one)."""
        return dp.id is not None and self.datapaths.get(dp.id) is dp

    def _refuse(self, dp, why: str):
        """Close a connection that may not program a switch; it never got a flow."""
        self.logger.warning("refused OpenFlow connection from %s: %s", dp.address, why)
        dp.close()
        try:  # end its read loop now, not at the next socket timeout
            dp.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def switch_reconnected(self, dp):
        """Hook: a switch came back and has its routes again (the bursts app re-applies meters)."""

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features_handler(self, ev):
        dp, dpid = ev.msg.datapath, ev.msg.datapath_id
        why = self.peers.check(dp.socket)
        if why is not None:
            self._refuse(dp, f"DPID {dpid:#x}: {why}")
            return
        try:
            name = self.topo.switch_by_dpid(dpid)
        except KeyError:
            self._refuse(dp, f"DPID {dpid:#x} is no switch of {self.topo.name}")
            return
        held = self.datapaths.get(dpid)
        if held is not None and held is not dp and held.is_active and held.state != DEAD_DISPATCHER:
            self._refuse(dp, f"switch {name} ({dpid:#x}) is already connected from {held.address}")
            return
        dp.id = dpid
        st = self.sw_state.setdefault(dp.id, {"name": name, "connects": 0})
        st.update(connected=True, routed=False)
        st["connects"] += 1
        self.datapaths[dp.id] = dp
        self._install_routes(dp)
        self.logger.info("switch %s (%#x) connected (%d), %d flows sent", name, dp.id,
                         st["connects"], st["flows"])
        if st["connects"] > 1:
            self.switch_reconnected(dp)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def barrier_reply_handler(self, ev):
        dp = ev.msg.datapath
        st = self.sw_state.get(dp.id)
        if st is not None and self.is_current(dp) and st.get("barrier_xid") == ev.msg.xid:
            st["routed"] = True
            st["routed_ns"] = time.time_ns()
        self._wake(ev.msg)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def error_msg_handler(self, ev):
        m = ev.msg
        if not self.is_current(m.datapath):  # a refused or half-open connection's say
            return
        self.logger.error("OpenFlow error from %#x: type=%s code=%s", m.datapath.id, m.type, m.code)

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def state_change_handler(self, ev):
        dp = ev.datapath
        if ev.state == DEAD_DISPATCHER and dp.id in self.sw_state and self.is_current(dp):
            self.sw_state[dp.id].update(connected=False, routed=False)
            self.datapaths.pop(dp.id, None)
            self.logger.warning("switch %s (%#x) disconnected", self.sw_state[dp.id]["name"], dp.id)

    # ------------------------------------------------------------------ control socket
    def status_fields(self) -> dict:
        """The ``StatusReply`` fields this app knows; each app adds its own (``super()`` first)."""
        sw = {str(d): SwitchStatus(name=s["name"], connected=s.get("connected", False),
                                   routed=s.get("routed", False), flows=s.get("flows", 0),
                                   connects=s["connects"]) for d, s in self.sw_state.items()}
        n_routed = sum(1 for s in sw.values() if s.routed)
        return {"topology": self.topo.name, "switches": sw, "routed": n_routed,
                "expected": len(self.topo.switches()), "ready": n_routed == len(self.topo.switches()),
                "multipath_bits": multipath_bits(self.topo), "pid": os.getpid()}

    def status_request(self, req: StatusRequest) -> StatusReply:
        return StatusReply(**self.status_fields())

    def close(self):
        self.control.close()
