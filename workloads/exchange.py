"""The one thing that differs between arms: how a flat gradient is averaged across workers.

Every exchange has ``allreduce_(flat) -> ExchangeResult`` (averages in
place) and ``close()``. Keeping the training loop identical and swapping only
this object is what makes the arms comparable.

The transports a process can run are one list, `transports()`: the
baselines registered here (`BASELINES`), `C10D` (a torch.distributed backend
the arm names, reached through DDP only) and every loss-bound policy of
``dblp.POLICIES``, read when asked, so a policy a researcher registers there
is an ``--arm`` of the worker and the server (and an arm of the harness,
``testbed.config.arms``) without a name written anywhere else. This module
imports torch only where an exchange runs, so the harness can read the list.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def dblp_transports() -> tuple[str, ...]:
    """The transports carried by dblp: its loss-bound policies, read late so registrations count."""
    from dblp.policy import POLICIES
    return tuple(POLICIES)


def transports() -> tuple[str, ...]:
    """Every transport a worker may run: the baselines, `C10D`, then dblp's policies."""
    return tuple(BASELINES) + (C10D,) + dblp_transports()


def uses_dblp(transport: str) -> bool:
    """Whether ``transport`` is carried by dblp (an aggregation server may run for it)."""
    return transport in dblp_transports()


def add_arm_arguments(parser) -> None:
    """``--arm`` (the transport) and ``--label`` (the arm's name), for worker and server.

    One transport runs under several arm names (static, static-tcp,
    static-sharded); logs and round announcements carry the name, so the
    analysis and the controller's burst schedule tell the arms apart.
    """
    parser.add_argument("--arm", required=True, choices=transports(), help="transport arm")
    parser.add_argument("--label", default=None, help="arm name in logs and round announcements "
                        "(default: --arm; e.g. static-tcp for the static transport with TCP control)")


def arm_label(args) -> str:
    return args.label or args.arm


@dataclass
class ExchangeResult:
    stats: dict = field(default_factory=dict)
    bound: float | None = None
    phase: str | None = None


@dataclass(frozen=True)
class Synced:
    """One round's exchange as the round log records it.

    ``comm_s``: seconds of the round spent exchanging the gradient.
    ``comm_cpu_s``: the process's CPU seconds in that exchange (None: not
    separable from the compute).
    """

    result: ExchangeResult
    comm_s: float
    comm_cpu_s: float | None


class LocalExchange:
    """No communication: each worker trains on its own shard (the compute-only bound)."""

    name = "local"

    @classmethod
    def from_args(cls, args) -> LocalExchange:
        return cls()

    def allreduce_(self, flat: torch.Tensor) -> ExchangeResult:
        return ExchangeResult({"latency_s": 0.0, "bytes_sent": 0}, None, None)

    def close(self) -> None:
        pass


class GlooExchange:
    """torch.distributed all-reduce with the gloo backend over TCP: what PyTorch users run today."""

    name = "gloo"

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int,
                 timeout_s: float):
        import torch.distributed as dist

        self.dist = dist
        self.world_size = world_size
        dist.init_process_group("gloo", init_method=f"tcp://{master_addr}:{master_port}",
                                rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))

    @classmethod
    def from_args(cls, args) -> GlooExchange:
        """The worker's resolved arguments (rank, world, rank 0's address and port, timeout)."""
        return cls(args.rank, args.world_size, args.master_addr, args.master_port, args.timeout_s)

    def allreduce_(self, flat: torch.Tensor) -> ExchangeResult:
        t0 = time.perf_counter()
        self.dist.all_reduce(flat)
        flat.div_(self.world_size)
        return ExchangeResult({"latency_s": time.perf_counter() - t0,
                               "payload_bytes": flat.numel() * flat.element_size()},
                              0.0, None)

    def close(self) -> None:
        try:
            self.dist.destroy_process_group()
        except Exception:  # a dead peer can make teardown fail; nothing left to save
            pass


#: The transports that do not use dblp, by name (the worker builds one with
#: ``from_args``); listed first wherever arms are listed.
BASELINES: dict[str, type] = {"local": LocalExchange, "gloo": GlooExchange}
#: The transport of an arm whose collectives are a torch.distributed backend
#: the arm names (``--backend``; a spec's ``[ddp.NAME]``), neither dblp nor
#: gloo: a researcher's own c10d backend, or one torch ships (mpi, ucc). It has
#: no exchange of its own for the flat loop: only DistributedDataParallel
#: reaches it (``workloads.ddp_exchange``), as a PyTorch job would.
C10D = "c10d"
#: The transports whose workers meet at rank 0 (``--master-port``): torch.distributed's.
RENDEZVOUS = ("gloo", C10D)
