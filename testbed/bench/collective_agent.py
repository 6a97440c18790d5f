"""One rank of a `bench collectives` transport, in its namespace: a torch.distributed group over
DBLP's backend or gloo that times one collective per "go".

Started by the driver (`testbed.bench.collectives`) through `testbed.bench.agents.Agent`
and driven by the same command lines as the transport bench's agents
(`testbed.bench.agents.serve_commands`): "prepare" names the collective and the
size and, when either changed, runs the warm-up calls (a DBLP stream joins on its
first call, which must not be timed); "go" times one call and counts the output
elements that differ from the exact result. Every rank's input is small integers
in float32 (1 to 13 plus the rank), so every exact sum is exact in float32
through DBLP's mean-times-n as through gloo's sum, and a zero-filled chunk (a
bounded round's missing chunks) can never look right: every expected element is
at least 1.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Any


def _pattern(torch, n: int, start: int = 0):
    """Elements ``start .. start + n`` of the inputs' pattern: 1 to 13, never zero."""
    return (torch.arange(start, start + n, dtype=torch.int64) % 13 + 1).to(torch.float32)


class CollectiveRunner:
    """This rank's buffers for one collective at one size, its timed call and its check."""

    def __init__(self, rank: int, world: int, pg_stats=None):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        self.rank, self.world = rank, world
        self.pg_stats = pg_stats  # DBLP: the group's per-stream RoundStats (``stats()``)
        self.key: tuple[str, int] | None = None
        # torch 2.6 renamed the tensor forms; the old names warn from then on
        self.all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.reduce_scatter = (getattr(dist, "reduce_scatter_single", None)
                               or dist.reduce_scatter_tensor)

    def prepare(self, collective: str, size: int, warmup: int = 0) -> None:
        """Buffers for ``collective`` on a ``size``-byte array, warmed up if new; fresh output."""
        if (collective, size) != self.key:
            self.key = None  # a failed warm-up leaves no half-made selection behind
            self._select(collective, size)
            for _ in range(warmup):
                self._reset()
                self._call()
            self.key = (collective, size)
        self._reset()

    def _select(self, collective: str, size: int) -> None:
        torch, r, n = self.torch, self.rank, self.world
        total = size // 4
        shard = total // n
        self.collective = collective
        if collective == "all_reduce":  # in place: the input is copied back before each call
            self.src = _pattern(torch, total) + r
            self.out = torch.empty(total)
            self.expected = n * _pattern(torch, total) + sum(range(n))
        elif collective == "all_gather":  # rank k's input is the array's k-th shard
            self.src = _pattern(torch, shard, r * shard) + r
            self.out = torch.empty(total)
            self.expected = _pattern(torch, total) + torch.arange(total) // shard
        elif collective == "reduce_scatter":  # rank k keeps the sum's k-th shard
            self.src = _pattern(torch, total) + r
            self.out = torch.empty(shard)
            self.expected = n * _pattern(torch, shard, r * shard) + sum(range(n))
        else:
            raise ValueError(f"unknown collective {collective!r}")

    def _reset(self) -> None:
        if self.collective == "all_reduce":
            self.out.copy_(self.src)
        else:
            self.out.zero_()  # a stale result from the last call cannot pass the check

    def _call(self) -> None:
        if self.collective == "all_reduce":
            self.dist.all_reduce(self.out)
        elif self.collective == "all_gather":
            self.all_gather(self.out, self.src)
        else:
            self.reduce_scatter(self.out, self.src)

    def run(self) -> dict:
        """One timed call: its time, the wrong elements, and DBLP's rounds' bytes and passes."""
        before = {k: len(v) for k, v in self.pg_stats().items()} if self.pg_stats else {}
        t0 = time.monotonic()
        self._call()
        latency = time.monotonic() - t0
        out = {"latency_s": latency, "wrong": int((self.out != self.expected).sum().item())}
        if self.pg_stats:
            new = [s for k, v in self.pg_stats().items() for s in v[before.get(k, 0):]]
            out["bytes_sent"] = sum(s.bytes_sent for s in new)
            out["passes"] = max((max(s.passes_push, s.passes_pull) for s in new), default=0)
            out["rounds"] = len(new)
        return out


def agent_main(argv: list[str]) -> None:
    """Join the group (rank 0 hosts the store), then serve "prepare"/"go" until "quit"."""
    import torch.distributed as dist

    from testbed.bench.agents import serve_commands
    args = json.loads(argv[0])
    timeout = datetime.timedelta(seconds=args["round_timeout"])
    kwargs: dict[str, Any] = {}
    if args["impl"] == "dblp":
        import dblp.torch_backend as backend
        os.environ["MASTER_ADDR"] = args["master"]  # where rank 0 advertises its streams
        # the job's secret, if any, comes in the environment ($DBLP_SECRET), read by options()
        kwargs["pg_options"] = backend.options(policy=args["policy"], rate_bps=args["rate_bps"],
                                               **args.get("knobs", {}))
    else:
        os.environ["GLOO_SOCKET_IFNAME"] = args["ifname"]
    dist.init_process_group(args["impl"], init_method=f"tcp://{args['master']}:{args['port']}",
                            rank=args["rank"], world_size=args["world"], timeout=timeout, **kwargs)
    pg = dist.group.WORLD
    runner = CollectiveRunner(args["rank"], args["world"],
                              getattr(pg, "stats", None) if args["impl"] == "dblp" else None)
    serve_commands(runner.prepare, runner.run)
    sys.stdout.flush()
    os._exit(0)  # a group after a timeout can hang in its destructor (gloo's does)


if __name__ == "__main__":
    agent_main(sys.argv[1:])
