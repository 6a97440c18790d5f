"""How the training loop hands its gradient to the transport: the registry of integrations.

Two ways exist, and an arm names one (``testbed.config.arms.Arm.integration``,
the worker's ``--integration``):

* ``flat`` (every arm's default): the fabric's own loop. After backward the
  worker copies every gradient into one flat buffer, the arm's exchange
  (``workloads.exchange``, ``workloads.dblp_exchange``) averages it in one
  round, and the worker copies it back. Nothing overlaps, so a round's
  communication time is exactly the exchange's.
* ``ddp``: what PyTorch users run. The model is wrapped in an unmodified
  ``torch.nn.parallel.DistributedDataParallel`` over
  ``init_process_group(BACKEND)``: ``dblp`` (``dblp.torch_backend``) for
  the transport's policies, ``gloo`` for the gloo transport, or any
  registered c10d backend the arm names (the ``c10d`` transport); DDP cuts
  the gradient into its buckets and all-reduces each one during backward
  (``workloads.ddp_exchange``).

The loop around them is the same (``workloads.worker.train``): batches,
loss, optimizer, evaluation and the round log, so the two are compared on
what differs and nothing else. An integration is a class with

* ``name`` and ``refuses(transport, control, mode, backend, module)``: why
  it cannot carry that transport run that way, over that torch.distributed
  backend registered by that module (None: it can). The harness asks it
  when an arm is registered, without importing torch;
* ``__init__(args, model)``: joins the job (the worker's resolved arguments);
* ``module``: what the forward pass runs through;
* ``sync() -> Synced``: called after backward; the gradients are averaged
  when it returns, with what the transport reported;
* ``close()``.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .ddp_exchange import DdpIntegration, backend_for
from .exchange import BASELINES, C10D, Synced

if TYPE_CHECKING:
    import torch


class Integration(Protocol):
    """What the worker's loop asks of an integration (see the module docstring)."""

    name: ClassVar[str]
    module: Any

    @classmethod
    def refuses(cls, transport: str, control: str | None, mode: str | None,
                backend: str | None = None, module: str | None = None) -> str | None: ...

    def sync(self) -> Synced: ...

    def close(self) -> None: ...


class FlatIntegration:
    """The fabric's own loop: one flat gradient, one exchange after backward.

    The flat buffer is allocated once; copying in and out costs about 0.1 ms
    for the digits CNN and is counted as compute, as it always was.
    """

    name: ClassVar[str] = "flat"

    @classmethod
    def refuses(cls, transport: str, control: str | None, mode: str | None,
                backend: str | None = None, module: str | None = None) -> str | None:
        if transport == C10D:
            return (f"transport {C10D!r} has no flat exchange: a backend the arm names is "
                    "reached through DDP (integration 'ddp')")
        if backend is not None or module is not None:
            return ("the flat loop runs the arm's own exchange; a torch.distributed backend "
                    "is named only under integration 'ddp'")
        return None   # every other exchange is written for this loop

    def __init__(self, args, model: torch.nn.Module):
        import torch

        self.module = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buf = torch.zeros(sum(p.numel() for p in self.params))
        self.exchange = make_exchange(args)

    def gather(self) -> torch.Tensor:
        off = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                self.buf[off:off + n].zero_()
            else:
                self.buf[off:off + n].copy_(p.grad.reshape(-1))
            off += n
        return self.buf

    def scatter(self) -> None:
        import torch

        off = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.copy_(self.buf[off:off + n].view_as(p))
            off += n

    def sync(self) -> Synced:
        g = self.gather()
        c1, p1 = time.perf_counter(), time.process_time()
        res = self.exchange.allreduce_(g)
        c2, p2 = time.perf_counter(), time.process_time()
        self.scatter()
        return Synced(res, c2 - c1, p2 - p1)

    def close(self) -> None:
        self.exchange.close()


def make_exchange(args):
    """The arm's exchange for the flat loop: a registered baseline, or dblp with the arm's policy."""
    if args.arm in BASELINES:
        return BASELINES[args.arm].from_args(args)
    from .dblp_exchange import DblpExchange
    return DblpExchange.from_args(args)


#: Every integration by name; the first is the default of every arm and of the worker.
INTEGRATIONS: dict[str, type] = {c.name: c for c in (FlatIntegration, DdpIntegration)}
#: The default integration's name.
FLAT = FlatIntegration.name
#: The name of DistributedDataParallel's integration.
DDP = DdpIntegration.name


def refusal(integration: str, transport: str, control: str | None, mode: str | None,
            backend: str | None = None, module: str | None = None) -> str | None:
    """Why ``integration`` cannot carry ``transport`` run that way (None: it can)."""
    cls = INTEGRATIONS.get(integration)
    if cls is None:
        return f"integration {integration!r} is not one of {list(INTEGRATIONS)}"
    return cls.refuses(transport, control, mode, backend, module)


def default_backend(integration: str, transport: str) -> str | None:
    """The torch.distributed backend ``integration`` reaches ``transport`` by when the arm
    names none (None: the flat loop, which names none, or a transport with no default)."""
    return backend_for(transport) if integration == DDP else None


def integration_argv(integration: str, backend: str | None = None,
                     module: str | None = None) -> list[str]:
    """The worker's flags for an arm's integration (none for the default): the one place
    the launcher's argv and the worker's parser meet."""
    if integration == FLAT:
        return []
    return (["--integration", integration] + (["--backend", backend] if backend else [])
            + (["--backend-module", module] if module else []))


def make_integration(args, model) -> Integration:
    """The worker's integration (``args.integration``), joined to its job."""
    return INTEGRATIONS[args.integration](args, model)
