"""The parameter server: N workers push, it averages, it pulls the average back."""
from __future__ import annotations

import socket
import time

import numpy as np

from . import wire
from .config import TransportConfig, merge, warn_unauthenticated
from .engine import Engine
from .join import Rendezvous, new_session_id, welcome_extras
from .rounds import Part, grad_norm, make_layout, max_passes, run_round
from .stats import RoundStats

DEFAULT_PORT = wire.DEFAULT_PORT


def policy_phase(policy) -> str:
    return getattr(policy, "phase", "") or policy.name


class ParameterServer:
    """Aggregator of parameter-server mode (rank ``world_size``; workers are 0..N-1).

    ``serve(rounds)`` joins the workers (first call), then runs rounds:
    ``on_round_start(round)`` before waiting for that round's pushes,
    ``on_round_end(round, stats)`` once the aggregate and FINAL went out.
    The server waits up to ``idle_timeout`` for the first message of a round
    (workers compute in between) and then ``round_timeout`` for the round.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = DEFAULT_PORT, world_size: int = 1,
                 policy=None, *, config: TransportConfig | None = None,
                 fault_rx_drop: float = 0.0, **settings):
        if not isinstance(world_size, int) or world_size < 1 or world_size > 65534:
            raise ValueError(f"world_size must be an int in [1, 65534], got {world_size!r}")
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        if policy is not None:
            settings["policy"] = policy
        cfg, self.policy = merge(config, settings)
        if cfg.mode != "ps":
            raise ValueError(f"mode={cfg.mode!r} has no parameter server (every rank aggregates "
                             "a shard): start only TransportGroups, or use mode='ps'")
        warn_unauthenticated(cfg, world_size, "aggregator")
        self.config = cfg
        self.world_size = world_size
        self.control = cfg.control
        self.missing = cfg.missing
        self.round_timeout = cfg.round_timeout
        self.join_timeout = cfg.join_timeout
        self.idle_timeout = cfg.idle_timeout
        self.session_id = cfg.session_id or new_session_id()
        control, rate_bps = cfg.control, cfg.rate_bps
        self.rank = world_size
        self.listen: socket.socket | None = None
        for attempt in range(20):
            self.engine = Engine(self.rank, bind=(host, port), session=self.session_id,
                                 rate_bps=rate_bps, fault_rx_drop=fault_rx_drop,
                                 **cfg.engine_options())
            self.port = self.engine.address[1]
            if control != "tcp":
                break
            # TCP control listens on the same port number as the UDP socket.
            self.listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                self.listen.bind((host, self.port))
                break
            except OSError:
                self.listen.close()
                self.engine.close()
                if port != 0 or attempt == 19:
                    raise
        if self.listen is not None:
            # A deep backlog: a connect flood must not make real members wait for SYN retries
            # (the engine holds at most world_size + 8 connections that have not said HELLO).
            self.listen.listen(max(128, world_size + 8))
        self.round = -1
        self.joined = False
        self.rendezvous: Rendezvous | None = None
        self.parts: list[Part] = []  # set at join, from the workers' tensor size
        self.result = np.zeros(0, np.float32)
        self._norm: float | None = None
        self.residual: dict | None = {} if cfg.missing == "error_feedback" else None
        self.history: list[RoundStats] = []

    @property
    def address(self) -> tuple[str, int]:
        return self.engine.address

    def _join(self) -> None:
        p = self.policy
        welcome = {"session": self.session_id, "world_size": self.world_size, "mode": "ps",
                   "server_rank": self.rank, "policy": p.name, "control": self.control,
                   "bound_ppm": wire.bound_to_ppm(p.bound(0)), "phase": policy_phase(p),
                   **welcome_extras(self.config.chunk_bytes)}
        rv = self.rendezvous = Rendezvous(self.engine, list(range(self.world_size)), welcome,
                                          want_tcp=self.control == "tcp", include_table=False,
                                          listen=self.listen,
                                          require_session=self.config.session_id is not None)
        rv.run(self.join_timeout)
        numel = rv.numel
        assert numel is not None, "a completed join knows the tensor size"
        self.parts = make_layout(numel, "ps", self.world_size, chunk_bytes=self.config.chunk_bytes)
        self.result = np.zeros(numel, np.float32)
        self.joined = True

    def _decide(self, aggregate: np.ndarray, detector_norm: float):
        r = self.engine.round
        # The "delivered" signal is this very norm of this very array: computed once.
        self._norm = detector_norm if self.config.signal == "delivered" else grad_norm(aggregate)
        self.policy.observe(r, detector_norm)
        nb = wire.bound_to_ppm(self.policy.bound(r + 1))
        return nb, policy_phase(self.policy) == "critical"

    def serve(self, rounds: int, on_round_start=None, on_round_end=None) -> list[RoundStats]:
        """Run ``rounds`` rounds (joining first if needed); returns their stats."""
        if not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"rounds must be a non-negative int, got {rounds!r}")
        if not self.joined:
            self._join()
        eng = self.engine
        out = []
        for _ in range(rounds):
            r = self.round + 1
            if on_round_start is not None:
                on_round_start(r)
            eng.begin_round(r)
            bound = wire.bound_to_ppm(self.policy.bound(r)) / wire.PPM  # what goes on the wire
            phase = policy_phase(self.policy)
            b0, c0 = eng.bytes_sent, eng.counters.snapshot()
            self._norm = None
            t0 = time.monotonic()
            res = run_round(eng, self.parts, list(range(self.world_size)), None, self.result,
                            wire.bound_to_ppm(bound), self.missing, self.round_timeout,
                            first_wait=self.idle_timeout, owner_residual=self.residual,
                            decide=self._decide, signal=self.config.signal)
            t1 = time.monotonic()
            self.round = r
            self.last_result = res
            senders = [s for g in res.pull_groups for s in g.senders.values()]
            pushed = sum(x.count for x in res.push_receivers)
            st = RoundStats(
                round=r, rank=self.rank, role="server", mode="ps", control=self.control,
                latency_s=t1 - t0, bound=bound, phase=phase,
                next_bound=(res.next_bound_ppm or 0) / wire.PPM, chunks=res.total_chunks,
                bytes_sent=eng.bytes_sent - b0, chunks_sent=sum(s.chunks_sent for s in senders),
                retransmitted=sum(s.retransmitted for s in senders),
                missing_at_stop=(sum(x.count - x.n_have for x in res.push_receivers) / pushed
                                 if pushed else 0.0),
                pull_missing=res.dropped_chunks / max(1, res.total_chunks),
                probe_rounds=sum(s.probes for s in senders),
                passes_push=max((x.max_pass for x in res.push_receivers), default=0),
                passes_pull=max_passes(senders),
                pace_late_s=eng.pace.late_s, pace_busy_s=eng.pace.busy_s,
                rtt_s=_mean_srtt(eng), grad_norm=self._norm,
                counters=eng.counters.diff(c0))
            self.history.append(st)
            out.append(st)
            if on_round_end is not None:
                on_round_end(r, st)
        eng.linger(min(2.0, self.round_timeout))
        return out

    def close(self) -> None:
        if self.listen is not None:
            self.listen.close()
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _mean_srtt(eng: Engine):
    vals = [e.srtt for e in eng.peers.rtts.values() if e.srtt is not None]
    return sum(vals) / len(vals) if vals else None
