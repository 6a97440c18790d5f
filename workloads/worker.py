"""Training worker entry point: ``python -m workloads.worker --arm ARM [...]``.

Configured by arguments and torchrun-style environment variables (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT; arguments win). What it trains (model,
rounds, seed, learning rate, batch, evaluation) comes from one
``--training-config`` file (``workloads.training``), as the harness writes it
for every unit, or, started by hand, from the flags of the same names; the
transport's settings from ``--transport-config``. It says on stderr which
settings it read, and from where. Synchronous data
parallel training: one gradient exchange per step, and only the exchange
differs between arms: by default one flat exchange after backward, nothing
overlapped; with ``--integration ddp`` DistributedDataParallel over a
torch.distributed backend: dblp's, gloo's, or the one ``--backend`` names
(registered by ``--backend-module``; ``workloads.integrations``). Writes the raw-log events that
``workloads.runlog.EVENTS`` declares to ``--log`` (stdout if omitted); human
messages go to stderr.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback

import torch

from dblp import wire

from . import exchange as ex
from . import training
from .control import RoundAnnouncer
from .integrations import FLAT, INTEGRATIONS, default_backend, make_integration, refusal
from .leave import leave
from .models import (
    LR_SCHEDULES,
    MODELS,
    build_model,
    get_spec,
    grad_bytes,
    make_optimizer,
    make_scheduler,
    num_params,
)
from .runlog import RunLog
from .tasks import make_task
from .training import DEFAULT_EVAL_EVERY, DEFAULT_MODEL, DEFAULT_ROUNDS

DEFAULT_TIMEOUT_S = 60.0
#: The training settings a worker takes as flags when it has no --training-config: all of them.
TRAINING_FLAGS = ("model", "rounds", "seed", "lr", "lr_schedule", "batch_size", "eval_every")


def _env_int(name: str, default: int | None) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise SystemExit(f"environment variable {name} must be an integer, got {v!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workloads.worker", description=__doc__.split("\n")[0])
    ex.add_arm_arguments(p)
    training.add_config_argument(p)
    # The training settings by hand; each default None (= not given), TrainingSettings' applies.
    p.add_argument("--model", default=None, choices=sorted(MODELS), help=f"default {DEFAULT_MODEL}")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"training steps (= exchanges); default {DEFAULT_ROUNDS}")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the model's)")
    p.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=None,
                   help="constant (the default), or cosine decay to zero over --rounds")
    p.add_argument("--batch-size", type=int, default=None, help="per-worker batch (default: the model's)")
    p.add_argument("--seed", type=int, default=None, help="model init, shards and batch order; default 0")
    p.add_argument("--eval-every", type=int, default=None,
                   help=f"evaluate every N rounds (and always at the end); 0 = only at the end; "
                        f"default {DEFAULT_EVAL_EVERY}")
    p.add_argument("--eval-ranks", choices=("0", "all"), default="0",
                   help="which workers evaluate (rank 0 saves compute; all checks replicas agree)")
    p.add_argument("--log", default=None,
                   help="JSON-lines log file (RUN/raw/<arm>/seed-<seed>/worker<rank>.jsonl)")
    p.add_argument("--rank", type=int, default=None, help="default: $RANK")
    p.add_argument("--world-size", type=int, default=None, help="number of workers; default: $WORLD_SIZE")
    p.add_argument("--master-addr", default=None,
                   help="gloo, c10d: rank 0's address; dblp arms: the server's. "
                        "Default: $MASTER_ADDR")
    p.add_argument("--master-port", type=int, default=None,
                   help=f"default: $MASTER_PORT; dblp arms fall back to {wire.DEFAULT_PORT}")
    p.add_argument("--timeout-s", type=float, default=None,
                   help=f"gloo, c10d arms: give up when peers are silent this long (default "
                        f"{DEFAULT_TIMEOUT_S:g}); dblp arms: round_timeout in --transport-config")
    p.add_argument("--integration", choices=list(INTEGRATIONS), default=FLAT,
                   help="how the loop hands the gradient to the transport: flat (one flat "
                        "exchange after backward) or ddp (DistributedDataParallel over "
                        "init_process_group(BACKEND); workloads.integrations)")
    p.add_argument("--backend", default=None, metavar="NAME",
                   help="--integration ddp: the torch.distributed backend (default: the "
                        "transport's own, dblp for its policies, gloo for gloo; the c10d arm "
                        "names one)")
    p.add_argument("--backend-module", default=None, metavar="MODULE",
                   help="--integration ddp, arm c10d: a module imported first, which "
                        "registers the backend (torch.distributed.Backend.register_backend)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (hosts share cores)")
    p.add_argument("--transport-config", default=None, metavar="PATH",
                   help="dblp arms: a dblp.TransportConfig JSON file (RUN/<arm>/transport.json) "
                        "with every transport setting; default: DBLP_* environment variables")
    return p


def resolve(args) -> argparse.Namespace:
    """Fill rank/world/master from the torchrun-style environment and validate every knob."""
    args.rank = args.rank if args.rank is not None else _env_int("RANK", 0)
    args.world_size = args.world_size if args.world_size is not None else _env_int("WORLD_SIZE", 1)
    args.master_addr = args.master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    args.master_port = args.master_port if args.master_port is not None else _env_int("MASTER_PORT", None)
    if args.world_size < 1:
        raise SystemExit(f"--world-size/WORLD_SIZE must be >= 1, got {args.world_size}")
    if not 0 <= args.rank < args.world_size:
        raise SystemExit(f"--rank/RANK must be in [0, {args.world_size}), got {args.rank}")
    args.training = training.from_args(args, TRAINING_FLAGS, MODELS)
    if ex.uses_dblp(args.arm):
        if args.timeout_s is not None:
            raise SystemExit("--timeout-s is for the gloo and c10d arms; dblp arms take round_timeout "
                             "from --transport-config")
        from .dblp_exchange import load_transport_config
        args.transport = load_transport_config(args.arm, args.transport_config)
    else:
        if args.transport_config is not None:
            raise SystemExit(f"--transport-config is for the dblp arms, not {args.arm!r}")
        args.transport = None
        args.timeout_s = DEFAULT_TIMEOUT_S if args.timeout_s is None else args.timeout_s
        if args.timeout_s <= 0:
            raise SystemExit(f"--timeout-s must be > 0, got {args.timeout_s}")
    if args.master_port is None and ex.uses_dblp(args.arm):
        args.master_port = wire.DEFAULT_PORT          # the transport's well-known port
    if args.arm in ex.RENDEZVOUS and args.master_port is None:
        raise SystemExit(f"arm {args.arm} needs --master-port or MASTER_PORT (rank 0's "
                         "rendezvous port)")
    cfg = args.transport
    args.backend = args.backend or default_backend(args.integration, args.arm)
    why = refusal(args.integration, args.arm, cfg.control if cfg else None,
                  cfg.mode if cfg else None, args.backend, args.backend_module)
    if why:
        raise SystemExit(f"--integration {args.integration}: {why}")
    return args


def train(args, log: RunLog) -> dict:
    """The training loop shared by every arm; returns the final evaluation."""
    t: training.TrainingSettings = args.training
    spec = get_spec(t.model)
    batch_size = t.batch_size or spec.batch_size
    print(f"worker {args.rank}: training settings from "
          f"{args.training_config or 'flags and defaults'}: {t.describe()}",
          file=sys.stderr, flush=True)
    torch.manual_seed(t.seed + 1000 * args.rank)  # dropout etc.; init uses build_model's seed
    model = build_model(t.model, t.seed)
    opt = make_optimizer(spec, model.parameters(), t.lr)
    sched = make_scheduler(opt, t.lr_schedule, t.rounds)
    task = make_task(spec, args.rank, args.world_size, batch_size, t.seed)
    gbytes = grad_bytes(model)
    over = f" over {args.backend}" if args.backend else ""
    print(f"worker {args.rank}/{args.world_size} arm={args.arm} ({args.integration}{over}) "
          f"model={t.model}: "
          f"{num_params(model)} parameters, gradient {gbytes} bytes ({gbytes / 1024:.1f} KiB) per round",
          file=sys.stderr, flush=True)
    log.write("start", pid=os.getpid(), model=t.model, params=num_params(model), grad_bytes=gbytes,
              world_size=args.world_size, seed=t.seed, t_ns=time.time_ns(),
              rounds=t.rounds, lr=opt.param_groups[0]["lr"], lr_schedule=t.lr_schedule,
              batch_size=batch_size, data_sha256=task.data_sha256)
    # Arms without a server announce rounds from worker rank 0.
    serverless = args.transport is None or args.transport.mode == "sharded"
    announcer = (RoundAnnouncer(ex.arm_label(args), seed=t.seed)
                 if (args.rank == 0 and serverless) else None)
    evaluates = args.eval_ranks == "all" or args.rank == 0
    integration = make_integration(args, model)
    model.train()
    eval_s = 0.0
    last_eval = None
    t_train0 = time.perf_counter()
    try:
        for r in range(t.rounds):
            t_start = time.time_ns()
            if announcer:
                announcer.round("start", r)
            c0, p0 = time.perf_counter(), time.process_time()
            x, y = task.batches.batch(r)
            opt.zero_grad(set_to_none=False)
            loss = task.loss_fn(integration.module(x), y)
            loss.backward()
            synced = integration.sync()
            res = synced.result
            opt.step()
            if sched is not None:
                sched.step()
            c3, p3 = time.perf_counter(), time.process_time()
            t_end = time.time_ns()
            if announcer:
                announcer.round("end", r)
            epoch = task.batches.epoch_of(r)
            log.write("round", round=r, epoch=epoch, t_start_ns=t_start, t_end_ns=t_end,
                      compute_s=max(0.0, (c3 - c0) - synced.comm_s), comm_s=synced.comm_s,
                      bound=res.bound, phase=res.phase, loss=loss.item(), stats=res.stats,
                      **_cpu_split(p3 - p0, synced.comm_cpu_s))
            last_round = r == t.rounds - 1
            if evaluates and (last_round or (t.eval_every and (r + 1) % t.eval_every == 0)):
                e0 = time.perf_counter()
                acc, tloss = task.evaluate(model)
                eval_s += time.perf_counter() - e0
                last_eval = {"round": r, "test_accuracy": acc, "test_loss": tloss}
                log.write("eval", round=r, epoch=epoch, t_ns=time.time_ns(), test_accuracy=acc,
                          test_loss=tloss)
    finally:
        if announcer:
            announcer.close()
        integration.close()
    return {"train_time_s": time.perf_counter() - t_train0 - eval_s, "eval": last_eval}


def _cpu_split(total_s: float, comm_s: float | None) -> dict:
    """The round's CPU seconds as compute and exchange; nothing when they cannot be told apart."""
    if comm_s is None:
        return {}
    return {"compute_cpu_s": max(0.0, total_s - comm_s), "comm_cpu_s": comm_s}


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt("terminated by SIGTERM")


def main(argv=None) -> int:
    args = resolve(build_parser().parse_args(argv))
    torch.set_num_threads(max(1, args.threads))
    log = RunLog(args.log, ex.arm_label(args), "worker", args.rank)
    t0 = time.perf_counter()
    # A supervisor stops workers with SIGTERM: still write the end line.
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        out = train(args, log)
    except KeyboardInterrupt as exc:
        why = str(exc) or "interrupted"
        log.write("end", status="error", train_time_s=time.perf_counter() - t0, error=why)
        print(f"worker {args.rank}: {why}", file=sys.stderr)
        return 130
    except Exception as exc:  # peer death, timeouts, transport errors: say so and stop
        msg = f"{type(exc).__name__}: {exc}".strip()
        log.write("end", status="error", train_time_s=time.perf_counter() - t0, error=msg)
        print(f"worker {args.rank} arm={args.arm}: training failed (peer died or unreachable?): {msg}",
              file=sys.stderr)
        if os.environ.get("DBLP_WORKER_TRACEBACK"):
            traceback.print_exc()
        return 1
    ev = out["eval"] or {}
    log.write("end", status="ok", train_time_s=out["train_time_s"],
              final_accuracy=ev.get("test_accuracy"), final_loss=ev.get("test_loss"))
    log.close()
    if ev:
        print(f"worker {args.rank} arm={args.arm}: done in {out['train_time_s']:.2f} s, "
              f"test accuracy {ev['test_accuracy']:.4f}, test loss {ev['test_loss']:.4f}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    leave(main())
