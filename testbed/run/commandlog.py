"""A command arm's log lines for a Python command: the contract's lines, written for you.

The contract (``testbed.run.command``, docs/commands.md) stays language-neutral:
any program that appends one JSON object per line to ``$TESTBED_LOG`` is a
command arm. A command written in Python need not spell the lines out:
`CommandLogWriter` writes ``start``, ``round_start``, ``round_end`` and
``eval`` as `LINES` declares them, stamps their ``t_ns``, times the exchange
(`CommandLogWriter.exchange`) for ``comm_s`` and the CPU split, and checks
each line against the declaration as it writes it, so a mistake fails in the
command, at the call that made it, in the contract's own words, instead of
later in the harness. It writes version `CONTRACT_VERSION` of the contract
(the declaration it reads is that version's). A command started by the
harness can import it: its ``PYTHONPATH`` starts with the repository's root.
Imports only the contract and the standard library (no torch, no harness)::

    from testbed.run.commandlog import CommandLogWriter

    with CommandLogWriter() as log:                  # appends to $TESTBED_LOG
        log.start(params=n, grad_bytes=4 * n)
        for r in range(rounds):
            log.round_start(r)
            ...forward, backward...
            with log.exchange():                     # comm_s, comm_cpu_s: the time in here
                ...send, receive...
            ...optimizer step...
            log.round_end(loss=loss, stats={"bytes_sent": sent})
            log.eval(r, test_accuracy=acc)           # after any round that ended
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

from testbed.run.command import CONTRACT_VERSION, LINES
from workloads.runlog import MalformedEvent, check_fields

__all__ = ["CONTRACT_VERSION", "CommandLogWriter", "ContractMisuse"]


class ContractMisuse(ValueError):
    """A line the contract does not allow (a field missing or of the wrong kind, a round out of
    order); the message says what, in the words of the declaration."""


class CommandLogWriter:
    """Appends the contract's lines to ``path`` (default ``$TESTBED_LOG``), one JSON object each.

    Each line is flushed as it is written: the harness reads the file while
    the command runs, announces rank 0's rounds as it reads them, and fails
    a worker silent for ``silence_s``. ``clock`` and ``cpu`` (``time.time_ns``,
    ``time.process_time``) are what the lines are stamped with.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, clock=time.time_ns,
                 cpu=time.process_time):
        if path is None:
            path = os.environ.get("TESTBED_LOG")
            if not path:
                raise ContractMisuse("TESTBED_LOG is not set: the harness names the log file "
                                     "of a worker (a server writes none); give a path to "
                                     "write elsewhere")
        self.path = os.fspath(path)
        self._fh = open(self.path, "a", buffering=1, encoding="utf-8")
        self.clock, self.cpu = clock, cpu
        self.under_way: int | None = None   # the round started and not yet ended
        self.ended = -1                     # the last round that ended
        self._cpu0 = 0.0                    # CPU seconds at the round's start
        self._comm_s = 0.0                  # time and CPU inside exchange() this round
        self._comm_cpu_s = 0.0
        self._timed = False                 # exchange() ran in this round

    # -- the lines -------------------------------------------------------------
    def write(self, event: str, **fields) -> dict:
        """One line of kind ``event`` with exactly ``fields``, checked against `LINES`;
        what was written. The methods below are this with the bookkeeping done."""
        if event not in LINES:
            raise ContractMisuse(f"event {event!r} is not one of {', '.join(LINES)} "
                                 f"(contract version {CONTRACT_VERSION})")
        line = {"event": event, **fields}
        try:
            check_fields(line, LINES[event], f"{event} line")
        except MalformedEvent as exc:
            raise ContractMisuse(str(exc)) from None
        self._fh.write(json.dumps(line) + "\n")
        return line

    def start(self, *, params: int | None = None, grad_bytes: int | None = None) -> dict:
        """The optional start line, once, before the first round."""
        return self.write("start", t_ns=self.clock(), **_given(params=params,
                                                               grad_bytes=grad_bytes))

    def round_start(self, round: int | None = None) -> dict:
        """Round ``round`` starts now (before its compute); default: the one after the last."""
        r = self.ended + 1 if round is None else round
        if self.under_way is not None:
            raise ContractMisuse(f"round_start of round {r} while round {self.under_way} has "
                                 "not ended")
        if r != self.ended + 1:
            raise ContractMisuse(f"round_start of round {r}, expected round {self.ended + 1}")
        line = self.write("round_start", round=r, t_ns=self.clock())
        self.under_way, self._cpu0 = r, self.cpu()
        self._comm_s = self._comm_cpu_s = 0.0
        self._timed = False
        return line

    @contextlib.contextmanager
    def exchange(self) -> Iterator[None]:
        """Time what runs inside as the round's exchange: its seconds add up to ``comm_s``, its
        CPU seconds to ``comm_cpu_s`` (the rest of the round's CPU is ``compute_cpu_s``)."""
        if self.under_way is None:
            raise ContractMisuse("an exchange outside a round (call round_start first)")
        t0, c0 = time.perf_counter(), self.cpu()
        try:
            yield
        finally:
            self._comm_s += time.perf_counter() - t0
            self._comm_cpu_s += self.cpu() - c0
            self._timed = True

    def round_end(self, round: int | None = None, *, comm_s: float | None = None,
                  loss: float | None = None, epoch: int | None = None,
                  stats: dict | None = None, compute_cpu_s: float | None = None,
                  comm_cpu_s: float | None = None) -> dict:
        """The round under way ends now (after the optimizer step).

        ``comm_s`` defaults to the time spent inside `exchange` this round,
        and with it the CPU split (``comm_cpu_s``, ``compute_cpu_s``); a
        round without `exchange` must give ``comm_s``. ``loss`` may be a
        tensor of one element.
        """
        r = self.under_way if round is None else round
        if r is None or r != self.under_way:
            under_way = (f"round {self.under_way} is under way" if self.under_way is not None
                         else "no round is under way")
            of = "" if r is None else f" of round {r}"
            raise ContractMisuse(f"round_end{of}, but {under_way}")
        if comm_s is None:
            if not self._timed:
                raise ContractMisuse(f"round_end of round {r}: give comm_s, or time the "
                                     "exchange with `with log.exchange():`")
            comm_s = self._comm_s
            if comm_cpu_s is None:
                comm_cpu_s = self._comm_cpu_s
                if compute_cpu_s is None:
                    compute_cpu_s = max(0.0, self.cpu() - self._cpu0 - comm_cpu_s)
        if loss is not None and hasattr(loss, "item"):
            loss = loss.item()
        line = self.write("round_end", round=r, t_ns=self.clock(), comm_s=float(comm_s),
                          **_given(loss=loss, epoch=epoch, stats=stats,
                                   compute_cpu_s=compute_cpu_s, comm_cpu_s=comm_cpu_s))
        self.under_way, self.ended = None, r
        return line

    def eval(self, round: int | None = None, *, test_accuracy: float | None,
             test_loss: float | None = None, epoch: int | None = None) -> dict:
        """The model was evaluated after round ``round`` (default: the last that ended);
        ``test_accuracy`` is a fraction in [0, 1], or None."""
        r = self.ended if round is None else round
        if r < 0 or r > self.ended:
            raise ContractMisuse(f"eval after round {r}, which has not ended")
        return self.write("eval", round=r, test_accuracy=test_accuracy, t_ns=self.clock(),
                          **_given(test_loss=test_loss, epoch=epoch))

    # -- the file ----------------------------------------------------------------
    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> CommandLogWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _given(**fields) -> dict:
    """The optional fields that were given (a field left out is not written as null)."""
    return {k: v for k, v in fields.items() if v is not None}
