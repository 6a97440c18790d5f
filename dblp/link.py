"""What the transfers and the batched receive path use of their engine, named as protocols.

`dblp.streams` (a round's transfers) and `dblp.batch` (the batched receive
path) are driven by `dblp.engine.Engine` and act on the network only through
it. Naming here the members they use, instead of importing `Engine`, keeps
both below the engine (the engine imports them, never the other way round)
and says exactly what a transfer may touch. `Engine` satisfies both
protocols structurally; mypy checks it where the engine hands itself over.
"""
from __future__ import annotations

from typing import Any, Protocol


class TransferLink(Protocol):
    """The engine as a transfer (`streams.OutTransfer`, `streams.InTransfer`) sees it."""

    # -- identity and the round ------------------------------------------------------
    rank: int
    session: int
    round: int
    control: str
    chunk_bytes: int
    chunk_order: str
    no_progress_probes: int
    # -- shared state it reads or updates ---------------------------------------------
    counters: Any
    peers: Any
    senders: Any
    progress: bool

    # -- sending, timers and estimates --------------------------------------------------
    def send_ctrl(self, peer: int, body: bytes, copies: int = 1) -> None: ...
    def send_data(self, hdr: bytes, payload: Any, peer: int) -> int: ...
    def send_data_batch(self, template: bytes, chunks: Any, rows: Any, peer: int) -> int: ...
    def copies(self, peer: int) -> int: ...
    def reply_copies(self, peer: int, requested: int) -> int: ...
    def rto(self, peer: int) -> float: ...
    def probe_timeout(self, peer: int, backoff: float) -> float: ...
    def reprobe_wait(self, peer: int) -> float: ...
    def sender_active(self, s: Any) -> None: ...
    def sender_done(self, s: Any) -> None: ...


class ReceiveLink(Protocol):
    """The engine as its batched receive path (`batch.deliver`) sees it."""

    rank: int
    session: int
    round: int
    chunk_bytes: int
    seen_round: bool
    counters: Any
    peers: Any
    finals: Any
    receivers: Any
    sealer: Any
    bad: Any
    kernel_allow: Any  # what the socket's kernel filter lets a keyed job hear (None: no filter)
    fault_rx_drop: float
    _fault_rng: Any

    def handle(self, buf: Any, n: int, addr: Any, tcp_peer: int | None, now: float) -> None: ...
    def failed_tag(self, buf: Any, n: int, addr: Any, now: float) -> None: ...
