"""The bursts app: the routing app plus the burst lifecycle (schedule, start, end, record).

A burst starts on a round event, at a time after the arm's first round, or
on request, and ends after its rounds (capped at ``max_ms``) or its
duration. What a burst does in the fabric is its kind's business
(``controllers.kinds``: ``loss`` an nftables rule, ``police`` OpenFlow 1.3
meters, ``congest`` cross traffic); this app only calls the `BurstKind`
interface, so it runs any registered kind. Each burst's actual start and end
and the packets it dropped go to its unit's ``raw/ARM/seed-SEED/bursts.jsonl``
as a ``controllers.bursts.BurstRecord``.

State is kept per unit, (arm, seed) as the round announcements name it:
the runner trains every arm once per seed, and each of those units meets
the whole schedule, its at_s bursts timed from its own first round.
"""
from __future__ import annotations

import json
import os
import time

from controllers.bursts import KINDS, BurstError, BurstRecord, BurstSchedule
from controllers.compat import MAIN_DISPATCHER, hub, ofp_event, set_ev_cls
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


class FabricBursts(FabricRouting):

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.schedule = BurstSchedule.from_dict(self.cfg.get("bursts"))
        self.active = {}         # (arm, seed, burst id) -> (BurstRecord, its BurstKind instance)
        self.done = []
        self.arm_t0 = {}         # (arm, seed) -> first round event t_ns (origin of at_s)
        self.seq = 0
        self.logger.info("fabric controller: %s, %d switches, %d hosts, %d bursts scheduled",
                         self.topo.name, len(self.topo.switches()), len(self.topo.hosts()),
                         len(self.schedule))
        self.kind_shared = {}    # kind name -> what its bursts share (BurstKind.open)
        for name in KINDS:
            self._shared(name)

    def _shared(self, kind: str):
        """What every burst of ``kind`` shares, opened on first use (BurstKind.open)."""
        if kind not in self.kind_shared:
            self.kind_shared[kind] = KINDS[kind].open(self)
        return self.kind_shared[kind]

    def spawn(self, fn, *args):
        """Run ``fn`` on the hub (a kind's background work, e.g. starting agents)."""
        return hub.spawn(fn, *args)

    def control_handlers(self) -> dict:
        return {**super().control_handlers(), RoundRequest: self.round_request,
                BurstRequest: self.burst_request, ScheduleRequest: self.schedule_request}

    def status_fields(self) -> dict:
        return {**super().status_fields(), "active_bursts": [r.spec.id for r, _ in self.active.values()],
                "bursts_done": len(self.done), "scheduled": len(self.schedule)}

    def switch_reconnected(self, dp):
        super().switch_reconnected(dp)
        for _rec, mech in list(self.active.values()):
            hub.spawn(mech.switch_reconnected, dp.id)

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
            mech = KINDS[spec.kind](self, rec, ports, self._shared(spec.kind))
            took_effect = mech.start()
            rec.actual_start_ns = took_effect or time.time_ns()
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
            mech.stop()
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

    def close(self):
        for key in list(self.active):
            try:
                self._end(key, time.time_ns())
            except Exception:
                self.logger.exception("burst %s did not end at shutdown", key[-1])
        for name, shared in list(self.kind_shared.items()):
            try:
                KINDS[name].close(self, shared)
            except Exception:
                self.logger.exception("burst kind %s did not close", name)
        super().close()
