"""The reliable, static and dblp arms: the gradient goes through ``dblp.TransportGroup``.

Only the policy name differs between the three arms; the server (parameter-
server mode) decides each round's bound and the group reports it back, so the
round log's ``bound``/``phase`` are what the transport actually used.
"""
from __future__ import annotations

import torch

from .exchange import DBLP_ARMS, ExchangeResult

MODES = ("ps", "sharded")
CONTROLS = ("udp", "tcp")
MISSING = ("zero", "mean", "error_feedback")


def transport_options(args) -> dict:
    """Transport knobs shared by worker and server, validated with the flag's name."""
    if args.control not in CONTROLS:
        raise SystemExit(f"--control must be one of {CONTROLS}, got {args.control!r}")
    if args.missing not in MISSING:
        raise SystemExit(f"--missing must be one of {MISSING}, got {args.missing!r}")
    if args.rate_bps is not None and args.rate_bps <= 0:
        raise SystemExit(f"--rate-bps must be > 0, got {args.rate_bps}")
    return {"control": args.control, "missing": args.missing, "rate_bps": args.rate_bps}


class DblpExchange:
    """One TransportGroup per worker; ``allreduce_`` returns the transport's RoundStats."""

    def __init__(self, arm: str, rank: int, world_size: int, master_addr: str, master_port: int,
                 knobs: dict, timeout_s: float, mode: str = "ps", control: str = "udp",
                 missing: str = "zero", rate_bps: float | None = None, join_timeout_s: float = 120.0):
        if arm not in DBLP_ARMS:
            raise ValueError(f"arm {arm!r} is not carried by dblp; choose from {DBLP_ARMS}")
        if mode not in MODES:
            raise ValueError(f"--mode must be one of {MODES}, got {mode!r}")
        import dblp

        self.name = arm
        self.group = dblp.TransportGroup(rank, world_size, master_addr, master_port, mode=mode,
                                         policy=arm, control=control, missing=missing,
                                         rate_bps=rate_bps, round_timeout=timeout_s,
                                         join_timeout=max(join_timeout_s, timeout_s), **knobs)

    def allreduce_(self, flat: torch.Tensor) -> ExchangeResult:
        st = self.group.allreduce_(flat)
        d = st.as_dict()
        return ExchangeResult(d, d.get("bound"), d.get("phase") or None)

    def close(self) -> None:
        self.group.close()
