"""Aggregation-server entry point: ``python -m workloads.server --arm {reliable,static,dblp} [...]``.

Runs ``dblp.ParameterServer`` for the arms the dblp transport carries and
announces every round's start and end on the controller's control socket
(``$DBLP_CONTROL_SOCKET``; a no-op when unset), so bursts can be triggered by
round number. The gloo and local arms have no server: their workers
all-reduce among themselves (gloo rank 0 announces rounds) and launching a
server for them is an error.

Configured by arguments and the torchrun-style environment: WORLD_SIZE is the
number of workers, MASTER_PORT the port to listen on (UDP data, and TCP when
the config's control is tcp). Every transport setting comes from
``--transport-config`` (a ``dblp.TransportConfig`` file), and the rounds to
serve, the model and the seed from ``--training-config``: the unit's
``training.json`` that its workers read too (``workloads.training``), or,
started by hand, the flags of the same names. Writes the raw-log events that
``workloads.runlog.EVENTS`` declares to ``--log``.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from dblp.wire import DEFAULT_PORT

from . import exchange as ex
from . import training
from .control import RoundAnnouncer
from .dblp_exchange import load_transport_config
from .leave import leave
from .models import MODELS, build_model, get_spec, grad_bytes, num_params
from .runlog import RunLog
from .training import DEFAULT_MODEL, DEFAULT_ROUNDS
from .worker import _env_int

#: The training settings a server takes as flags when it has no --training-config: those it
#: uses (it never builds a batch or steps an optimizer).
TRAINING_FLAGS = ("rounds", "model", "seed", "batch_size")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workloads.server", description=__doc__.split("\n")[0])
    ex.add_arm_arguments(p)
    training.add_config_argument(p)
    p.add_argument("--rounds", type=int, default=None,
                   help=f"rounds to serve (= worker --rounds); default {DEFAULT_ROUNDS}")
    p.add_argument("--world-size", type=int, default=None, help="number of workers; default: $WORLD_SIZE")
    p.add_argument("--host", default="0.0.0.0", help="address to bind")
    p.add_argument("--port", type=int, default=None, help=f"default: $MASTER_PORT, else {DEFAULT_PORT}")
    p.add_argument("--log", default=None, help="JSON-lines log file (RUN/raw/<arm>/seed-<seed>/server.jsonl)")
    p.add_argument("--transport-config", default=None, metavar="PATH",
                   help="a dblp.TransportConfig JSON file (RUN/<arm>/transport.json) with every "
                        "transport setting; default: DBLP_* environment variables")
    # Only for the start line and the epoch column: the server never builds batches.
    p.add_argument("--model", default=None, choices=sorted(MODELS), help=f"default {DEFAULT_MODEL}")
    p.add_argument("--seed", type=int, default=None, help="default 0")
    p.add_argument("--batch-size", type=int, default=None, help="default: the model's")
    return p


def rounds_per_epoch(model: str, world_size: int, batch_size: int | None) -> int:
    """Steps per epoch of the workers' shards (what check_every=epoch means)."""
    from .tasks import make_task
    spec = get_spec(model)
    return make_task(spec, 0, world_size, batch_size or spec.batch_size, 0).batches.per_epoch


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt("terminated by SIGTERM")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not ex.uses_dblp(args.arm):
        print(f"workloads.server: arm {args.arm!r} has no aggregation server (its workers "
              f"exchange directly); launch only workers. Server arms: "
              f"{', '.join(ex.dblp_transports())}",
              file=sys.stderr)
        return 2
    world = args.world_size if args.world_size is not None else _env_int("WORLD_SIZE", None)
    if world is None or world < 1:
        raise SystemExit(f"--world-size/WORLD_SIZE must be a number of workers >= 1, got {world}")
    port = args.port if args.port is not None else _env_int("MASTER_PORT", DEFAULT_PORT)
    t = training.from_args(args, TRAINING_FLAGS, MODELS)
    print(f"server: training settings from {args.training_config or 'flags and defaults'}: "
          f"{t.describe()}", file=sys.stderr, flush=True)
    cfg = load_transport_config(args.arm, args.transport_config)
    rpe = rounds_per_epoch(t.model, world, t.batch_size)

    import dblp

    log = RunLog(args.log, ex.arm_label(args), "server", world)   # the server is rank N in dblp's numbering
    signal.signal(signal.SIGTERM, _on_sigterm)
    model = build_model(t.model, t.seed)
    t0 = time.perf_counter()
    try:
        srv = dblp.ParameterServer(args.host, port, world, config=cfg)
    except (ValueError, OSError) as exc:
        log.write("end", status="error", train_time_s=0.0, error=f"{type(exc).__name__}: {exc}")
        print(f"workloads.server: cannot start: {exc}", file=sys.stderr)
        return 2
    print(f"server arm={args.arm} listening on {args.host}:{srv.port} for {world} workers, "
          f"{t.rounds} rounds, policy {srv.policy.name} {srv.policy.knobs()}, model {t.model} "
          f"(gradient {grad_bytes(model)} bytes)", file=sys.stderr, flush=True)
    log.write("start", pid=os.getpid(), model=t.model, params=num_params(model),
              grad_bytes=grad_bytes(model), world_size=world, seed=t.seed, t_ns=time.time_ns(),
              rounds=t.rounds,
              port=srv.port, policy=srv.policy.name, knobs=srv.policy.knobs(), control=cfg.control,
              missing=cfg.missing, rate_bps=cfg.rate_bps, transport=cfg.public_dict())
    announcer = RoundAnnouncer(ex.arm_label(args), seed=t.seed)
    starts: dict[int, int] = {}
    cpu: dict[int, float] = {}   # process CPU seconds at each round's start

    def on_start(r: int) -> None:
        starts[r] = time.time_ns()
        cpu[r] = time.process_time()
        announcer.round("start", r)

    def on_end(r: int, st) -> None:
        t_end = time.time_ns()
        announcer.round("end", r)
        d = st.as_dict()
        log.write("round", round=r, epoch=r // rpe, t_start_ns=starts.pop(r, t_end), t_end_ns=t_end,
                  compute_s=0.0, comm_s=d["latency_s"], compute_cpu_s=0.0,
                  comm_cpu_s=time.process_time() - cpu.pop(r, time.process_time()),
                  bound=d["bound"], phase=d["phase"] or None,
                  loss=None, stats=d)

    t_serve = time.perf_counter()
    try:
        srv.serve(t.rounds, on_round_start=on_start, on_round_end=on_end)
    except KeyboardInterrupt as exc:
        log.write("end", status="error", train_time_s=time.perf_counter() - t_serve,
                  error=str(exc) or "interrupted")
        return 130
    except Exception as exc:  # dead worker (PeerTimeout/PeerClosed), socket errors
        msg = f"{type(exc).__name__}: {exc}"
        log.write("end", status="error", train_time_s=time.perf_counter() - t_serve, error=msg)
        print(f"server arm={args.arm}: failed (a worker died or is unreachable?): {msg}", file=sys.stderr)
        return 1
    finally:
        announcer.close()
        srv.close()
    log.write("end", status="ok", train_time_s=time.perf_counter() - t_serve,
              wall_s=time.perf_counter() - t0)
    log.close()
    print(f"server arm={args.arm}: served {t.rounds} rounds", file=sys.stderr)
    return 0


if __name__ == "__main__":
    leave(main())
