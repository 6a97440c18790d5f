"""DBLP: a phase-aware bounded-loss gradient transport (UDP data, UDP or TCP control).

Public API (stable; workloads and the harness code against these names)
-----------------------------------------------------------------------
Settings: one frozen, typed, validated object (``dblp.config``)::

    cfg = dblp.TransportConfig(policy="dblp" | "static" | "reliable", p=0.008,   # static
                               p_low=0.008, p_high=None (= p_low + 0.40), threshold=0.5,
                               check_every=10 | "epoch", rounds_per_epoch=None, norm="mean",
                               signal="delivered" (the paper's) | "rescaled",
                               control="udp" | "tcp", mode="ps" | "sharded",
                               missing="zero" | "mean" | "error_feedback",
                               rate_bps=None, round_timeout=30.0, join_timeout=120.0,
                               idle_timeout=600.0, hello_timeout=5.0, early_bytes=8 MiB,
                               session_id=None, secret=None (hex; authenticates every message),
                               # prototype mode (the authors' prototype's costs, one each):
                               chunk_bytes=1408 (8192: IP-fragmented), chunk_order="shuffled"
                               | "fixed", probe_wait=None (adaptive) | seconds (UDP control),
                               nagle=False (True: Nagle on the TCP control connections),
                               bucket_s=None (0.1: 100 ms bucket steps into default-sized
                               socket buffers), no_progress_probes=0 (10: re-probe instead of
                               resending while the receiver's bitmap is unchanged),
                               # the data path (dblp.batch): same bytes on the wire either way
                               batched_io=True (UDP GSO sends, recvmmsg reads as arrays)
                               | False (one system call per datagram))
    # a bad value raises ValueError naming the setting and its range
    cfg.write(run_dir / dblp.CONFIG_FILE); cfg = dblp.TransportConfig.read(path)  # JSON, 0600
    cfg.to_json() / dblp.TransportConfig.from_json(text)   # "schema": 1; others refused
    cfg = dblp.TransportConfig.from_env()   # $DBLP_CONFIG file, DBLP_<SETTING>, $DBLP_SECRET
    dblp.POLICIES, dblp.CONTROLS, dblp.MODES, dblp.MISSING, dblp.SIGNALS, dblp.ORDERS  # registries
    # signal: what the phase detector measures (dblp.rounds.detector_norm); "rescaled"
    # corrects for the round's own drops, "delivered" (the zero-filled norm) does not

Policies (only the aggregator consults them; its decision reaches everyone)::

    cfg.make_policy()                  # the configured policy, fresh
    dblp.make_policy("static", p=0.008)
    dblp.make_policy("dblp", p_low=0.008, p_high=None, threshold=0.5, check_every=10)

Parameter-server mode (N workers + 1 server; the paper's setup)::

    srv = dblp.ParameterServer(host="0.0.0.0", port=47474, world_size=N, config=cfg)
    # keyword settings still work and override cfg: ParameterServer(..., policy="static", p=0.02)
    stats_list = srv.serve(rounds, on_round_start=f(round), on_round_end=f(round, stats))
    srv.close()

    group = dblp.TransportGroup(rank, world_size, master_addr, master_port=47474, config=cfg)
    #   sharded + rate_bps: each destination is capped at rate_bps / (world_size - 1)
    group = dblp.TransportGroup.from_env(**overrides)   # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    #   + TransportConfig.from_env for the settings
    stats = group.allreduce_(flat_tensor)   # torch or numpy, in place -> mean; returns RoundStats
    stats.as_dict()  # round, rank, role, mode, control, latency_s, bound, phase, next_bound,
                     # chunks, bytes_sent, chunks_sent, retransmitted, missing_at_stop,
                     # pull_missing, probe_rounds, passes_push, passes_pull, rtt_s,
                     # grad_norm, counters{unauthenticated, malformed, foreign, stale,
                     # duplicates, late, early_dropped, sender_dropped, resends_skipped}
    group.close()

    model.register_comm_hook(group, dblp.ddp_comm_hook)   # DDP, single bucket

torch.distributed backend (``dblp.torch_backend``; imports torch, so not imported here)::

    import dblp.torch_backend   # registers "dblp"
    dist.init_process_group("dblp", pg_options=dblp.torch_backend.options(policy="static",
                                                                          p=0.01))
    ddp = DistributedDataParallel(model)   # unchanged; plain torchrun, no other process
    dist.group.WORLD.stats()   # {"grad/<numel>" | "exact/<n>": [RoundStats, ...]}
    # sharded only (mode="ps" / control="tcp" options: ValueError); all_reduce of floats
    # with SUM/AVG is bounded (one stream per size), broadcast/all_gather/barrier and
    # other all_reduces exact; reduce/gather/scatter/... raise NotImplementedError

Pacing: set ``rate_bps`` (server and workers) to the bottleneck link rate; unpaced
senders overflow shallow switch queues and turn that into loss. With ``batched_io``
one send carries up to 0.5 ms of the rate (1 datagram at 20 Mbit/s, 4 at 100 Mbit/s,
44, one 64 KB GSO packet, from 1.1 Gbit/s) and never more than the bucket holds.

Sharded mode: no server; every rank aggregates 1/N of the gradient, rank 0 also
runs the rendezvous on MASTER_PORT. In PS mode ``world_size`` counts workers
(ranks 0..N-1); the server is rank N. The tensor size is fixed per group.

Loopback helper for tests and demos: ``dblp.testing.run_job(...)``.

Wire format: ``dblp.wire`` (one declaration: ``HEADER_FIELDS`` and the MAC
trailer ``TRAILER_FIELDS``); scapy layer: ``dblp.scapy_layer.DBLP`` and
``dblp.scapy_layer.bind(port)``.

Security: give every job a secret (``TransportConfig(secret=secrets.token_hex(32))``,
or ``$DBLP_SECRET``), made by whoever starts the job and never sent. Every
message then carries an AES-128-GMAC tag over header and payload, under a
key derived from the secret for its session, sender and the rank it is for,
with a per-message number in the header as nonce; one that fails is counted
(``unauthenticated``) and dropped before it is parsed, a source that keeps
sending such is dropped by its address before verification, and nothing (not even the session id) is told to a
sender without the secret. Joins are a challenge (``dblp.join``): no replayed
HELLO or WELCOME, of this job or of an earlier one with the same secret,
pins, moves or misleads a rank. A rank with another secret raises within
2 s saying so; a job without one warns once on every rank at start.
Without a secret the job is open to anyone who can reach its port, but a
rank's address is pinned at its join and only that address speaks for it.
Either way no datagram and no TCP byte sequence raises out of the engine.

Errors: ``dblp.TransportError``; a dead or silent peer raises ``dblp.PeerTimeout``
within ``round_timeout`` naming the rank and what was missing; a closed TCP
control connection raises ``dblp.PeerClosed``. A member that hears nothing
from its aggregator logs a warning (logger ``dblp``) naming the address after
``hello_timeout`` and raises after ``join_timeout``; under the torch backend,
where the store already proved every rank alive, it raises after ``hello_timeout``.

Identical replicas: every member answers the pull with a bitmap; the aggregator
takes the union U of chunks any member lacks, repairs until |U| <= P x chunks,
and sends FINAL(U); every replica (the aggregator's included) zero-fills exactly
U, so all apply a bit-identical aggregate. FINAL also tells each member which of
its pushed chunks the aggregate took, so a lost STOP costs no wait. In sharded
mode a rank returns from ``allreduce_`` once its FINALs are acknowledged (or
repeated a bounded number of times): a caller that then blocks elsewhere cannot
leave a peer waiting for a FINAL until the deadline.
"""
from .config import CONFIG_FILE, CONTROLS, MISSING, MODES, ORDERS, SIGNALS, TransportConfig
from .errors import PeerClosed, PeerTimeout, TransportError
from .group import TransportGroup, ddp_comm_hook
from .policy import POLICIES, PhaseAwareBound, ReliablePolicy, StaticBound, make_policy
from .server import DEFAULT_PORT, ParameterServer
from .stats import Counters, RoundStats

__all__ = [
    "TransportConfig", "CONFIG_FILE", "CONTROLS", "MODES", "MISSING", "SIGNALS", "ORDERS",
    "POLICIES", "make_policy", "ReliablePolicy", "StaticBound", "PhaseAwareBound",
    "ParameterServer", "TransportGroup", "ddp_comm_hook", "RoundStats", "Counters",
    "TransportError", "PeerTimeout", "PeerClosed", "DEFAULT_PORT",
]
