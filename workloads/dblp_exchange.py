"""The reliable, static and dblp arms: the gradient goes through ``dblp.TransportGroup``.

Only the policy name differs between the three arms; the server (parameter-
server mode) decides each round's bound and the group reports it back, so the
round log's ``bound``/``phase`` are what the transport actually used. Every
transport setting arrives in one ``dblp.TransportConfig`` (the run directory's
``transport.json``), never as command-line strings.
"""
from __future__ import annotations

import torch

from .exchange import ExchangeResult, dblp_transports, uses_dblp


def load_transport_config(arm: str, path: str | None):
    """The arm's transport settings: ``path`` (a ``TransportConfig`` file) or the environment.

    Without a file the settings come from ``dblp.TransportConfig.from_env``
    (``DBLP_<SETTING>`` and ``DBLP_SECRET``, torchrun style) with the arm's policy.
    The file's policy must be the arm's: a mismatch is a launcher bug, not a choice.
    """
    from dblp import TransportConfig
    try:
        if path is None:
            return TransportConfig.from_env(policy=arm)
        cfg = TransportConfig.read(path)
    except ValueError as exc:
        raise SystemExit(f"--transport-config: {exc}") from None
    if cfg.policy != arm:
        raise SystemExit(f"--transport-config {path} has policy {cfg.policy!r} but --arm is {arm!r}")
    return cfg


class DblpExchange:
    """One TransportGroup per worker; ``allreduce_`` returns the transport's RoundStats."""

    def __init__(self, arm: str, rank: int, world_size: int, master_addr: str, master_port: int,
                 config):
        if not uses_dblp(arm):
            raise ValueError(f"arm {arm!r} is not carried by dblp; choose from {dblp_transports()}")
        import dblp

        self.name = arm
        self.group = dblp.TransportGroup(rank, world_size, master_addr, master_port, config=config)

    @classmethod
    def from_args(cls, args) -> DblpExchange:
        """The worker's resolved arguments (its transport config read by ``resolve``)."""
        return cls(args.arm, args.rank, args.world_size, args.master_addr, args.master_port,
                   args.transport)

    def allreduce_(self, flat: torch.Tensor) -> ExchangeResult:
        st = self.group.allreduce_(flat)
        d = st.as_dict()
        return ExchangeResult(d, d.get("bound"), d.get("phase") or None)

    def close(self) -> None:
        self.group.close()
