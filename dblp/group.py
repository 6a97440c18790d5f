"""The member side: ``TransportGroup.allreduce_`` averages a flat gradient in place.

Parameter-server mode ("ps"): this process is worker ``rank`` of
``world_size``; a ``ParameterServer`` listens at MASTER_ADDR:MASTER_PORT.
Sharded mode ("sharded"): no server; rank ``s`` aggregates shard ``s`` and rank
0 also runs the rendezvous at MASTER_ADDR:MASTER_PORT. Configure from the
torchrun-style environment with ``TransportGroup.from_env()``.
"""
from __future__ import annotations

import os
import socket
import time

import numpy as np

from . import wire
from .config import TransportConfig, merge, warn_unauthenticated
from .engine import Engine
from .errors import TransportError
from .join import (
    Rendezvous,
    bind_control,
    join_aggregator,
    new_nonce,
    new_session_id,
    welcome_extras,
)
from .rounds import grad_norm, make_layout, max_passes, run_round
from .server import DEFAULT_PORT, _mean_srtt, policy_phase
from .stats import RoundStats


def _int_knob(name: str, value, lo: int, hi: int) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, float) and v != value or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return v


#: What a member that hears nothing from its aggregator should check, by mode.
_AGGREGATOR_HINT = {
    "ps": "is a dblp.ParameterServer running there? torchrun starts none: use "
          "mode='sharded' (DBLP_MODE=sharded) or the torch.distributed backend "
          "(dblp.torch_backend)",
    "sharded": "has rank 0 started, and is MASTER_ADDR:MASTER_PORT its address?",
}


class TransportGroup:
    """A member of a DBLP job. ``allreduce_(t)`` -> RoundStats, ``t`` now the mean.

    In PS mode the loss bound of each round is the server's (it arrives in
    the FINAL of the previous round); ``policy`` matters in sharded mode,
    where every rank decides identically from the identical aggregate.
    """

    def __init__(self, rank: int, world_size: int, master_addr: str = "127.0.0.1",
                 master_port: int = DEFAULT_PORT, *, config: TransportConfig | None = None,
                 bind_host: str = "0.0.0.0", fault_rx_drop: float = 0.0, **settings):
        self.world_size = _int_knob("world_size", world_size, 1, 65534)
        self.rank = _int_knob("rank", rank, 0, self.world_size - 1)
        cfg, self.policy = merge(config, settings)
        # Port 0: the sharded rendezvous (rank 0) binds an ephemeral port and
        # advertises ``self.master_port`` out of band (the torch.distributed store).
        ephemeral = cfg.mode == "sharded" and self.rank == 0
        self.master_port = _int_knob("master_port", master_port, 0 if ephemeral else 1, 65535)
        if cfg.mode == "sharded" and cfg.control == "tcp":
            raise ValueError("control='tcp' is supported in mode='ps' only (the paper's design)")
        try:
            self.master_ip = socket.gethostbyname(master_addr)
        except (OSError, UnicodeError, TypeError):
            raise ValueError(f"master_addr {master_addr!r} does not resolve") from None
        warn_unauthenticated(cfg, self.rank, "member")
        self.config = cfg
        self.mode = mode = cfg.mode
        self.control = cfg.control
        self.missing = missing = cfg.missing
        self.session_id = session_id = cfg.session_id
        self.round_timeout = cfg.round_timeout
        self.join_timeout = cfg.join_timeout
        rate_bps = cfg.rate_bps
        self.server_rank = self.world_size if mode == "ps" else 0
        bind_port = self.master_port if (mode == "sharded" and self.rank == 0) else 0
        # Sharded: each of the N-1 peers may take 1/(N-1) of the rate, so the
        # N-1 senders into one downlink never offer more than rate_bps to it.
        peer_rate = (rate_bps / (self.world_size - 1)
                     if mode == "sharded" and rate_bps and self.world_size > 2 else None)
        self.engine = Engine(self.rank, bind=(bind_host, bind_port), rate_bps=rate_bps,
                             peer_rate_bps=peer_rate, session=session_id or 0,
                             fault_rx_drop=fault_rx_drop, **cfg.engine_options())
        if bind_port == 0 and ephemeral:
            self.master_port = self.engine.address[1]
        self.round = -1
        self.numel: int | None = None
        self.residual: np.ndarray | None = None
        self.owner_residual: dict | None = {} if missing == "error_feedback" else None
        self.bound_ppm = wire.bound_to_ppm(self.policy.bound(0))
        self.phase = policy_phase(self.policy)
        self.policy_name = self.policy.name
        self.history: list[RoundStats] = []
        self._listen = None

    @classmethod
    def from_env(cls, env=None, **kwargs) -> TransportGroup:
        """Build from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's variables).

        Transport settings come from ``TransportConfig.from_env`` (``$DBLP_CONFIG``,
        ``DBLP_<SETTING>``, the key in ``$DBLP_SECRET``); keyword arguments win
        over the environment.
        """
        env = os.environ if env is None else env
        args = {}
        for var, key in (("RANK", "rank"), ("WORLD_SIZE", "world_size"),
                         ("MASTER_ADDR", "master_addr"), ("MASTER_PORT", "master_port")):
            if key in kwargs:
                args[key] = kwargs.pop(key)
                continue
            if var not in env:
                if var == "MASTER_PORT":
                    continue
                raise ValueError(f"environment variable {var} is not set (torchrun sets it)")
            args[key] = env[var]
        for key in ("rank", "world_size", "master_port"):
            if key in args:
                args[key] = _int_knob(key, args[key], 0, 65535)
        for key in ("bind_host", "fault_rx_drop"):
            if key in kwargs:
                args[key] = kwargs.pop(key)
        config = kwargs.pop("config", None)
        if config is None:
            config = TransportConfig.from_env(env)
        return cls(config=config, **args, **kwargs)

    # -- joining ----------------------------------------------------------------------
    def _join(self, numel: int) -> None:
        eng = self.engine
        master = (self.master_ip, self.master_port)
        if self.mode == "sharded" and self.rank == 0:
            eng.session = self.session_id or new_session_id()
            welcome = {"session": eng.session, "world_size": self.world_size, "mode": "sharded",
                       "policy": self.policy.name, "bound_ppm": self.bound_ppm, "numel": numel,
                       **welcome_extras(self.config.chunk_bytes)}
            rv = Rendezvous(eng, list(range(1, self.world_size)), welcome, want_tcp=False,
                            include_table=True, listen=None,
                            require_session=self.session_id is not None)
            rv.addrs[0] = master
            rv.expected.add(0)
            rv.run(self.join_timeout)
            self.numel = numel
            return
        hello = {"rank": self.rank, "numel": numel, "mode": self.mode, "nonce": new_nonce()}
        w = join_aggregator(eng, master, self.server_rank, hello, self.join_timeout,
                            self.session_id, quiet_after=self.config.hello_timeout,
                            hint=_AGGREGATOR_HINT[self.mode])
        if w["numel"] != numel:
            raise ValueError(f"tensor of {numel} elements, but the job uses {w['numel']}")
        if w["mode"] != self.mode:
            raise ValueError(f"mode={self.mode!r} but the aggregator runs {w['mode']!r}")
        if w["chunk_bytes"] != self.config.chunk_bytes:
            raise ValueError(f"chunk_bytes={self.config.chunk_bytes} but the aggregator cuts "
                             f"chunks of {w['chunk_bytes']} bytes: give every rank one config")
        eng.session = w["session"]
        eng.joining.handler = None
        self.bound_ppm = w["bound_ppm"]
        self.phase = w.get("phase", self.phase)
        self.policy_name = w["policy"]
        if self.mode == "sharded":
            if set(w.get("peers", {})) != set(range(self.world_size)):
                raise TransportError("the rendezvous sent an incomplete address table")
            for r, a in w["peers"].items():
                if r != self.rank:
                    eng.peers.addrs[r] = a
            eng.peers.addrs[0] = master
        eng.refilter()  # the session and the peers the kernel may let through
        if self.control == "tcp":
            # Proved on this connection alone (its nonce under our MAC): a sniffed HELLO
            # binds no other connection in its place (dblp.join).
            conn = bind_control(eng, master, self.server_rank, hello, self.join_timeout)
            eng.peers.tcp[self.server_rank] = conn
            eng.register_tcp(conn)
        self.numel = numel

    # -- the collective ----------------------------------------------------------------
    def _round_signal(self) -> str | None:
        """The detector signal a round measures: a sharded round's, if its policy reads it.

        Every replica decides the next bound from the round's norm, so a sharded
        round computes it before it returns: a pass over the whole model (64 MiB:
        7 ms in C on an idle machine, of a 0.13-0.18 s round at 10 Gbit/s). A
        policy that ignores the norm (reliable, static) does not pay for it; the
        round's ``grad_norm`` is then None.
        """
        if self.mode == "sharded" and self.policy.READS_NORM:
            return self.config.signal
        return None

    def allreduce_(self, tensor) -> RoundStats:
        """Average ``tensor`` (flat, any float dtype; torch or numpy) across the group."""
        arr, writeback = _as_flat_float32(tensor)
        numel = int(arr.size)
        if numel == 0:
            raise ValueError("tensor must not be empty")
        if self.numel is None:
            self._join(numel)
            self.parts = make_layout(numel, self.mode, self.world_size,
                                     chunk_bytes=self.config.chunk_bytes)
            self.result = np.zeros(numel, np.float32)
            if self.missing == "error_feedback":
                self.residual = np.zeros(numel, np.float32)
        elif numel != self.numel:
            raise ValueError(f"tensor has {numel} elements; this group was set up for {self.numel}")
        eng = self.engine
        r = self.round + 1
        eng.begin_round(r)
        contribution = arr if self.residual is None else arr + self.residual
        contribution = np.ascontiguousarray(contribution, dtype=np.float32)
        b0, c0 = eng.bytes_sent, eng.counters.snapshot()
        bound, phase = self.bound_ppm, self.phase
        t0 = time.monotonic()
        res = run_round(eng, self.parts, list(range(self.world_size)), contribution, self.result,
                        bound, self.missing, self.round_timeout,
                        owner_residual=self.owner_residual, settle=True,
                        signal=self._round_signal())
        t1 = time.monotonic()
        if self.config.slowdown:
            # Test only (TransportConfig.slowdown): the same exchange, made longer on purpose.
            time.sleep(self.config.slowdown * (t1 - t0))
            t1 = time.monotonic()
        self.round = r
        self.last_result = res
        # Error feedback: what the aggregator did not take is carried to the next round.
        if self.residual is not None:
            self.residual[:] = 0
            for s in res.push_senders:
                part = self.parts[s.part]
                lost = part.expand(~s.held)
                self.residual[part.start:part.stop] = np.where(lost, s.data, 0)
        # Sharded rounds measured the "delivered" signal, this very norm, already; a
        # sharded round whose policy ignores the norm measures none.
        norm: float | None = None
        if self.mode == "sharded" and res.detector_norm is not None \
                and self.config.signal == "delivered":
            norm = res.detector_norm
        elif self.mode == "ps" or self.policy.READS_NORM:
            norm = grad_norm(self.result)
        if self.mode == "ps":
            self.bound_ppm = res.next_bound_ppm if res.next_bound_ppm is not None else bound
            if self.policy_name == "dblp":
                self.phase = "critical" if res.critical else "relaxed"
        else:
            if self.policy.READS_NORM:
                assert res.detector_norm is not None, "a sharded round measures the detector norm"
                self.policy.observe(r, res.detector_norm)
            self.bound_ppm = wire.bound_to_ppm(self.policy.bound(r + 1))
            self.phase = policy_phase(self.policy)
        arr[:] = self.result
        if writeback is not None:
            writeback(arr)
        pulls = [s for g in res.pull_groups for s in g.senders.values()]
        senders = res.push_senders + pulls
        pushed = sum(s.count for s in res.push_senders)
        st = RoundStats(
            round=r, rank=self.rank, role="worker" if self.mode == "ps" else "peer",
            mode=self.mode, control=self.control, latency_s=t1 - t0, bound=bound / wire.PPM,
            phase=phase, next_bound=self.bound_ppm / wire.PPM, chunks=res.total_chunks,
            bytes_sent=eng.bytes_sent - b0, chunks_sent=sum(s.chunks_sent for s in senders),
            retransmitted=sum(s.retransmitted for s in senders),
            missing_at_stop=(sum(int((~s.held).sum()) for s in res.push_senders) / pushed
                             if pushed else 0.0),
            pull_missing=(sum(int(x.final.sum()) for x in res.pull_receivers)
                          + sum(int(g.dropped.sum()) for g in res.pull_groups))
            / max(1, res.total_chunks),
            probe_rounds=sum(s.probes for s in senders),
            passes_push=max_passes(res.push_senders),
            passes_pull=max([x.max_pass for x in res.pull_receivers] + [max_passes(pulls)]),
            push_s=_since(t0, [s.t_done for s in res.push_senders], max),
            pull_first_s=_since(t0, [x.t_first for x in res.pull_receivers], min),
            pull_stop_s=_since(t0, [x.t_stop for x in res.pull_receivers], max),
            pace_late_s=eng.pace.late_s, pace_busy_s=eng.pace.busy_s,
            rtt_s=_mean_srtt(eng), grad_norm=norm, counters=eng.counters.diff(c0))
        self.history.append(st)
        return st

    def close(self) -> None:
        """Answer stragglers briefly (lost DONEs), then release the sockets."""
        try:
            self.engine.linger(0.5)
        finally:
            self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _since(t0, times, pick):
    times = [t for t in times if t is not None]
    return pick(times) - t0 if times else None


def _as_flat_float32(tensor):
    """A float32 numpy view of ``tensor`` and, if a copy was needed, how to write back."""
    if isinstance(tensor, np.ndarray):
        if tensor.dtype == np.float32 and tensor.flags.c_contiguous:
            return tensor.reshape(-1), None
        tmp = np.ascontiguousarray(tensor, dtype=np.float32).reshape(-1)

        def wb_array(a, t=tensor):
            t[...] = a.reshape(t.shape)
        return tmp, wb_array
    try:
        import torch
    except ImportError:  # pragma: no cover
        raise ValueError("tensor must be a numpy array or a torch tensor") from None
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor must be a numpy array or a torch tensor, got {type(tensor)}")
    t = tensor.detach()
    if t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous():
        return t.view(-1).numpy(), None
    tmp = t.to("cpu", torch.float32).contiguous().view(-1).numpy().copy()

    def wb_tensor(a, t=tensor):
        with torch.no_grad():
            t.copy_(torch.from_numpy(a).view(t.shape))
    return tmp, wb_tensor


def ddp_comm_hook(group: TransportGroup, bucket):
    """DDP communication hook: ``model.register_comm_hook(group, ddp_comm_hook)``.

    The group has a fixed tensor size, so give DDP a single bucket
    (``bucket_cap_mb`` >= the model's gradient size); a bucket of another size
    raises ValueError. The hook blocks and DDP still needs a process group
    beside it; ``dblp.torch_backend`` (``init_process_group("dblp")``) needs
    neither and takes any number of buckets.
    """
    import torch
    buf = bucket.buffer()
    group.allreduce_(buf)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut
