"""One rank of the torch-backend tests that run under plain torchrun (not collected by pytest).

    python -m torch.distributed.run --standalone --nproc_per_node N \\
        tests/unit/torch_backend_ranks.py SCENARIO --out FILE [...]

Scenarios: ``collectives`` (reduce_scatter, all_gather_into_tensor and the
refusals, as a user calls them through ``torch.distributed``), ``fsdp`` (a
small model under FSDP2 ``fully_shard`` or FSDP1, over ``--backend dblp`` or
gloo) and ``timeout`` (the group's timeout and ``Work.wait(timeout)`` when a
rank never calls the collective). Rank 0 writes what it saw to ``--out`` as
JSON; the tests in test_torch_backend_sharded.py judge it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dblp.torch_backend as tb


def _init(backend: str, timeout_s: float | None = None, **settings) -> None:
    kwargs = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    if backend == "dblp":
        dist.init_process_group("dblp", pg_options=tb.options(**settings), **kwargs)
    else:
        dist.init_process_group(backend, **kwargs)


def _error(fn) -> str:
    """The error ``fn()`` raised (type and message), or "" if it returned."""
    try:
        fn()
    except Exception as exc:  # what the user would see is the result
        return f"{type(exc).__name__}: {exc}"
    return ""


def collectives(args) -> dict:
    _init("dblp", policy="reliable")
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"world": world}
    m = 5  # elements per shard
    # reduce_scatter_tensor, concatenated input: rank r holds r + 10 * i + j at shard i, element j
    inp = torch.tensor([[rank + 10.0 * i + j for j in range(m)] for i in range(world)])
    shard = torch.empty(m)
    dist.reduce_scatter_tensor(shard, inp.reshape(-1), op=dist.ReduceOp.SUM)
    out["rs_tensor_sum"] = shard.tolist()
    # stacked input, AVG
    dist.reduce_scatter_tensor(shard, inp, op=dist.ReduceOp.AVG)
    out["rs_tensor_avg"] = shard.tolist()
    # list form, float64 and an odd shape
    parts = [torch.full((2, 3), float(rank + i), dtype=torch.float64) for i in range(world)]
    got = torch.empty(2, 3, dtype=torch.float64)
    dist.reduce_scatter(got, parts, op=dist.ReduceOp.SUM)
    out["rs_list_sum"] = got.reshape(-1).tolist()
    out["rs_list_dtype"] = str(got.dtype)
    # integers: exact
    ints = torch.tensor([2**40 + rank * world + i for i in range(world)], dtype=torch.int64)
    one = torch.empty(1, dtype=torch.int64)
    dist.reduce_scatter_tensor(one, ints, op=dist.ReduceOp.SUM)
    out["rs_int_sum"] = one.tolist()
    dist.reduce_scatter_tensor(one, ints, op=dist.ReduceOp.MAX)
    out["rs_int_max"] = one.tolist()
    # asynchronous, as FSDP calls it
    work = dist.reduce_scatter_tensor(shard, inp.reshape(-1), op=dist.ReduceOp.AVG, async_op=True)
    out["rs_async_wait"] = work.wait()
    out["rs_async"] = shard.tolist()
    # all_gather_into_tensor: concatenated and stacked
    mine = torch.arange(3, dtype=torch.float32) + 100 * rank
    cat = torch.empty(3 * world)
    dist.all_gather_into_tensor(cat, mine)
    out["ag_cat"] = cat.tolist()
    stacked = torch.empty(world, 3)
    dist.all_gather_into_tensor(stacked, mine)
    out["ag_stack"] = stacked.tolist()
    # what is refused, and the group still works afterwards
    out["refused_premul_sum"] = _error(lambda: dist.reduce_scatter_tensor(
        shard, inp.reshape(-1), op=dist.ReduceOp.PREMUL_SUM(0.5)))
    out["refused_all_to_all_single"] = _error(lambda: dist.all_to_all_single(
        torch.empty(world), torch.ones(world)))
    out["refused_all_to_all"] = _error(lambda: dist.all_to_all(
        [torch.empty(1) for _ in range(world)], [torch.ones(1) for _ in range(world)]))
    out["refused_send"] = _error(lambda: dist.send(torch.ones(1), dst=(rank + 1) % world))
    out["refused_recv"] = _error(lambda: dist.recv(torch.ones(1), src=(rank + 1) % world))
    out["refused_reduce"] = _error(lambda: dist.reduce(torch.ones(1), dst=0))
    out["refused_gather"] = _error(lambda: dist.gather(
        torch.ones(1), [torch.empty(1) for _ in range(world)] if rank == 0 else None, dst=0))
    out["refused_scatter"] = _error(lambda: dist.scatter(
        torch.empty(1), [torch.ones(1) for _ in range(world)] if rank == 0 else None, src=0))
    after = torch.ones(4)
    dist.all_reduce(after)
    out["after_refusals"] = after.tolist()
    out["streams"] = sorted(dist.group.WORLD.stats())  # type: ignore[union-attr]
    dist.barrier()
    dist.destroy_process_group()
    return out


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def fsdp(args) -> dict:
    if args.backend == "dblp":
        _init("dblp", policy=args.policy)
    else:
        _init(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = _model()
    if args.fsdp == 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel
        wrapped = FullyShardedDataParallel(model, use_orig_params=True,
                                           device_id=torch.device("cpu"))
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    # each rank its own batch, the same one every step, so the loss must fall
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(16, 16, generator=gen), torch.randint(0, 4, (16,), generator=gen)
    losses = []
    for _ in range(args.steps):
        opt.zero_grad()
        loss = F.cross_entropy(wrapped(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    if args.fsdp == 2:
        full = [p.full_tensor().detach().reshape(-1) for p in wrapped.parameters()]
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel
        with FullyShardedDataParallel.summon_full_params(wrapped):
            full = [p.detach().clone().reshape(-1) for p in wrapped.parameters()]
    flat = torch.cat(full)
    replicas = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(replicas, flat)
    out = {"backend": args.backend, "fsdp": args.fsdp, "world": world, "losses": losses,
           "params": flat.tolist(),
           "replicas_identical": all(torch.equal(replicas[0], r) for r in replicas[1:])}
    pg = dist.group.WORLD
    if isinstance(pg, tb.DblpProcessGroup):
        out["rounds"] = {k: len(v) for k, v in pg.stats().items()}
    dist.barrier()
    dist.destroy_process_group()
    return out


def timeout(args) -> dict:
    """Rank 1 takes part in the first collectives, then never calls the next ones."""
    t_s = args.timeout
    _init("dblp", timeout_s=t_s, policy="reliable")
    sub = dist.new_group(backend="dblp", timeout=datetime.timedelta(seconds=t_s))
    rank = dist.get_rank()
    done = pathlib.Path(args.out + ".done")
    out: dict = {"timeout_s": t_s}
    t = torch.ones(1000)
    work = dist.all_reduce(t, async_op=True)
    out["wait_in_time"] = work.wait(timeout=datetime.timedelta(seconds=10))
    out["sum"] = t[:3].tolist()
    if rank != 0:
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        dist.destroy_process_group()
        return out
    try:
        # an existing stream: rank 1 never joins this round
        work = dist.all_reduce(t, async_op=True)
        t0 = time.monotonic()
        out["short_wait_error"] = _error(lambda: work.wait(timeout=datetime.timedelta(seconds=0.5)))
        out["short_wait_s"] = time.monotonic() - t0
        out["long_wait_error"] = _error(work.wait)
        out["long_wait_s"] = time.monotonic() - t0
        # a new stream (another group, another size): rank 1 never reaches its store barrier
        t1 = time.monotonic()
        out["new_stream_error"] = _error(lambda: dist.all_reduce(torch.ones(7), group=sub))
        out["new_stream_s"] = time.monotonic() - t1
    finally:
        done.touch()
    dist.destroy_process_group()
    return out


SCENARIOS = {"collectives": collectives, "fsdp": fsdp, "timeout": timeout}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="dblp")
    ap.add_argument("--policy", default="reliable")
    ap.add_argument("--fsdp", type=int, choices=(1, 2), default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=2.0)
    args = ap.parse_args()
    try:
        out = SCENARIOS[args.scenario](args)
    except Exception:
        out = {"crashed": traceback.format_exc()}
        if int(os.environ.get("RANK", "0")) == 0:
            pathlib.Path(args.out).write_text(json.dumps(out))
        raise
    if int(os.environ.get("RANK", "0")) == 0:
        pathlib.Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
