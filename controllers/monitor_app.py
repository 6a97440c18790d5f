"""The port-monitor app: the routing app plus periodic port statistics (``simple_monitor_13``).

Why: the analysis checks every run for drops inside the emulator (OVS
tx_dropped, errors) next to the achieved vs shaped rate, from
``raw/port_stats.jsonl``. Off when the configuration's ``monitor_s`` is 0.
"""
from __future__ import annotations

import json
import os
import time

from controllers.compat import MAIN_DISPATCHER, hub, ofp_event, set_ev_cls
from controllers.routing_app import FabricRouting


class FabricMonitor(FabricRouting):

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.monitor_s = float(self.cfg.get("monitor_s") or 0)
        self.port_stats = {}     # dpid -> {port: counters} (latest reply)
        if self.monitor_s > 0:
            hub.spawn(self._monitor)

    def status_fields(self) -> dict:
        return {**super().status_fields(), "monitor_s": self.monitor_s}

    def _monitor(self):
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
