"""The port-monitor app: the routing app plus periodic port statistics (``simple_monitor_13``).

Why: the analysis checks every run for drops inside the emulator (OVS
tx_dropped, errors) next to the achieved vs shaped rate, from
``raw/port_stats.jsonl``. Off when the configuration's ``monitor_s`` is 0.
Only a reply to a request this app sent, on the connection it sent it on
(by DPID and xid), is written: anything else that claims to be a
``PortStatsReply`` is dropped unread, so no connection can put counters
into the file the analysis trusts.
"""
from __future__ import annotations

import json
import os
import time

from controllers.compat import MAIN_DISPATCHER, hub, ofp_event, set_ev_cls
from controllers.routing_app import FabricRouting

#: How long a port-stats request waits for its reply before it is forgotten
#: (at least this, and at least four monitor periods).
PENDING_S = 10.0


class FabricMonitor(FabricRouting):

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.monitor_s = float(self.cfg.get("monitor_s") or 0)
        self.port_stats = {}     # dpid -> {port: counters} (latest reply)
        self.stats_pending = {}  # (dpid, xid) -> (the datapath asked, monotonic time sent)
        if self.monitor_s > 0:
            hub.spawn(self._monitor)

    def status_fields(self) -> dict:
        return {**super().status_fields(), "monitor_s": self.monitor_s}

    def _monitor(self):
        while True:
            hub.sleep(self.monitor_s)
            now = time.monotonic()
            keep = max(PENDING_S, 4 * self.monitor_s)
            for key, (_dp, sent) in list(self.stats_pending.items()):
                if now - sent > keep:
                    self.stats_pending.pop(key, None)
            for dp in list(self.datapaths.values()):
                parser = dp.ofproto_parser
                req = parser.OFPPortStatsRequest(dp, 0, dp.ofproto.OFPP_ANY)
                dp.set_xid(req)
                self.stats_pending[(dp.id, req.xid)] = (dp, now)
                dp.send_msg(req)

    def _solicited(self, msg) -> bool:
        """Whether ``msg`` answers a port-stats request of ours on its connection (forgotten after
        its last part)."""
        dp, key = msg.datapath, (msg.datapath.id, msg.xid)
        asked = self.stats_pending.get(key)
        if asked is None or asked[0] is not dp or not self.is_current(dp):
            return False
        if not msg.flags & dp.ofproto.OFPMPF_REPLY_MORE:
            self.stats_pending.pop(key, None)
        return True

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def port_stats_reply_handler(self, ev):
        dp, t = ev.msg.datapath, time.time_ns()
        if not self._solicited(ev.msg):
            self.logger.debug("unsolicited port stats from %s (xid %s) dropped", dp.address, ev.msg.xid)
            self._wake(ev.msg)
            return
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
