"""Per-round statistics and the never-fatal anomaly counters."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Counters:
    """Datagrams the transport ignored, by reason, and what prototype mode cost. Never fatal."""

    unauthenticated: int = 0  # MAC missing or wrong (the job has a secret)
    malformed: int = 0  # not a DBLP message, bad field, truncated
    foreign: int = 0  # another session, unknown peer, address or stream; refused joins and conns
    stale: int = 0  # an earlier round
    duplicates: int = 0  # a chunk already held
    late: int = 0  # data after the receiver froze its result (push STOP)
    early_dropped: int = 0  # a future round beyond the bounded early buffer
    # Prototype mode's own costs, counted where they happen (never with the defaults):
    sender_dropped: int = 0  # data datagrams a full send buffer refused (``bucket_s``)
    resends_skipped: int = 0  # BITMAPs answered with a probe, not a resend (``no_progress_probes``)

    def snapshot(self) -> dict:
        return dataclasses.asdict(self)

    def diff(self, before: dict) -> dict:
        now = self.snapshot()
        return {k: now[k] - before.get(k, 0) for k in now}


@dataclasses.dataclass
class RoundStats:
    """What one round cost, from one participant's point of view."""

    round: int
    rank: int
    role: str  # "worker" | "server" | "peer"
    mode: str  # "ps" | "sharded"
    control: str  # "udp" | "tcp"
    latency_s: float = 0.0
    bound: float = 0.0  # loss bound P used in this round
    phase: str = ""  # critical | relaxed | static | reliable
    next_bound: float = 0.0  # what the aggregator decided for the next round
    chunks: int = 0  # chunks of the gradient (one copy)
    bytes_sent: int = 0  # UDP/TCP payload bytes this participant sent (data + control)
    chunks_sent: int = 0  # data datagrams sent, retransmissions included
    retransmitted: int = 0  # data datagrams sent in passes after the first
    missing_at_stop: float = 0.0  # fraction of pushed chunks the aggregator lacked at STOP
    pull_missing: float = 0.0  # fraction of the aggregate zero-filled on every replica
    probe_rounds: int = 0  # PROBE transmissions (copies count once)
    passes_push: int = 0  # data passes of the push (max over streams)
    passes_pull: int = 0  # data passes of the pull (max over streams)
    push_s: float | None = None  # worker: start -> last push STOP received
    pull_first_s: float | None = None  # worker: start -> first chunk of the pull
    pull_stop_s: float | None = None  # worker: start -> pull satisfied (STOP sent)
    rtt_s: float | None = None  # smoothed probe RTT
    # pacing error: how much later than its bucket allowed the loop woke to send,
    # and how long it had data to send (dblp.pacing.PaceAudit); 0 when unpaced
    pace_late_s: float = 0.0
    pace_busy_s: float = 0.0
    # norm of the applied aggregate; None in a sharded round whose policy ignores it
    grad_norm: float | None = None
    counters: dict = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
