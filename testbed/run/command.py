"""The command arms' contract: what the harness hands a user's command, and what it must write.

A command arm (``testbed.config.arms.Command``, declared in a spec's
``[commands.NAME]`` section) runs a user's own transport on the emulated
hosts. This module is the contract in code, declared once, and docs/commands.md
is the same contract in prose (a unit test holds the two equal):

- `ENV`: the environment variables the harness sets for every process of the
  command (the working directory is the repository's root, `ROOT`);
- `LINES`: the JSON lines a worker writes to the file named by ``$TESTBED_LOG``,
  one per round start, round end and evaluation (and optionally one start line);
- `CommandLog`: the adapter that reads those lines while the command runs,
  checks each against `LINES` and the order of rounds, and writes them as the
  project's own raw-log events (``workloads.runlog.EVENTS``: start, round,
  eval, end) into ``worker<rank>.jsonl``, so the analysis reads a command arm
  exactly as it reads a built-in one. `CommandLog.poll` and `CommandLog.finish`
  return the round starts and ends they adapted; the command launcher
  (``testbed.run.commandlauncher``) announces rank 0's to the controller
  (``workloads.control.RoundAnnouncer``) so round-locked bursts follow the
  command's rounds.

A line that breaks the contract fails the unit with one line naming the file,
the line number and what is wrong (`ContractError`); a worker that writes
nothing for ``silence_s`` fails it naming the last line it wrote. Neither
hangs the run.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from workloads.runlog import Field, MalformedEvent, RunLog, check_fields

#: Version of the contract below (docs/commands.md says which it describes).
CONTRACT_VERSION = 1
#: The command's working directory: the repository's root, so relative paths
#: in a spec (``examples/udp_average.py``) mean the same on every host.
ROOT = pathlib.Path(__file__).resolve().parents[2]
#: A worker's own log beside its adapted one: RUN/raw/<arm>/seed-<seed>/worker<rank>.command.log
#: (not ``.jsonl``: the analysis reads every ``*.jsonl`` of a unit as raw-log events).
COMMAND_LOG = "worker{rank}.command.log"

#: THE environment a command's processes get (besides the harness's own): name -> meaning.
ENV: dict[str, str] = {
    "TESTBED_ROLE": "worker or server",
    "RANK": "the worker's rank, 0 .. WORLD_SIZE-1 (not set for the server)",
    "WORLD_SIZE": "the number of workers",
    "MASTER_ADDR": "the server's IP address; without a server, rank 0's (which then runs on "
                   "the server's host)",
    "MASTER_PORT": "the port the server (without one, rank 0) listens on",
    "TESTBED_SECRET": "a fresh random key for this unit (64 hex digits), the same for its "
                      "server and workers, never written to the run directory",
    "TESTBED_SEED": "the unit's seed (model initialisation, data shards, batch order)",
    "TESTBED_ROUNDS": "rounds to train (spec training.rounds)",
    "TESTBED_EVAL_EVERY": "evaluate after every this many rounds, and after the last "
                          "(spec training.eval_every)",
    "TESTBED_MODEL": "the model's name in workloads.models (spec training.model)",
    "TESTBED_BATCH_SIZE": "per-worker batch, 0 for the model's default (spec training.batch_size)",
    "TESTBED_LR": "learning rate, 0 for the model's default (spec training.lr)",
    "TESTBED_RATE_BPS": "this process's fair share of the bottleneck, bit/s: what a sender "
                        "without congestion control should pace at (a worker: 95 % of the link "
                        "over the workers, or all of it without a server; the server: 95 % of "
                        "the link)",
    "TESTBED_LOG": "the file a worker appends its JSON lines to (not set for the server)",
    "PYTHONPATH": "starts with the repository's root, so a Python command can import the "
                  "project's workloads (models, data)",
}


def _f(name, kind, doc, required=True, nullable=False) -> Field:
    return Field(name, kind, required, nullable, doc)


_EVENT = _f("event", "str", "the line's kind, a key of LINES")
#: THE lines a worker writes to $TESTBED_LOG, one JSON object per line: event -> fields.
LINES: dict[str, tuple[Field, ...]] = {
    "start": (
        _EVENT,
        _f("t_ns", "int", "time.time_ns() now", required=False),
        _f("params", "int", "the model's trainable parameters", required=False),
        _f("grad_bytes", "int", "gradient bytes the worker sends per round", required=False),
    ),
    "round_start": (
        _EVENT,
        _f("round", "int", "the round, from 0, one after the last one ended"),
        _f("t_ns", "int", "time.time_ns() as the round starts (before its compute)"),
    ),
    "round_end": (
        _EVENT,
        _f("round", "int", "the round that started last"),
        _f("t_ns", "int", "time.time_ns() as the round ends (after the optimizer step)"),
        _f("comm_s", "num", "seconds of the round spent exchanging the gradient"),
        _f("loss", "num", "training loss", required=False, nullable=True),
        _f("epoch", "int", "epoch of the round (default 0)", required=False),
        _f("stats", "dict", "the transport's own counters for the round, numbers by name "
           "(bytes_sent, dropped, ...)", required=False),
        _f("compute_cpu_s", "num", "the process's CPU seconds in the round's compute",
           required=False),
        _f("comm_cpu_s", "num", "the process's CPU seconds in the round's exchange",
           required=False),
    ),
    "eval": (
        _EVENT,
        _f("round", "int", "the round after which the model was evaluated (one that ended)"),
        _f("test_accuracy", "num", "test accuracy, a fraction in [0, 1]", nullable=True),
        _f("test_loss", "num", "test loss", required=False, nullable=True),
        _f("t_ns", "int", "time.time_ns() after the evaluation", required=False),
        _f("epoch", "int", "epoch of that round (default 0)", required=False),
    ),
}


class ContractError(Exception):
    """A command broke the contract; the message is one line naming the file and the line."""


def command_argv(argv: Sequence[str]) -> list[str]:
    """The argv to start: a first word ``python`` (or ``python3``) is the harness's interpreter.

    Why: the emulated hosts run as root with root's PATH, where ``python``
    may be another interpreter than the one that has the project's packages.
    """
    argv = list(argv)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def command_env(base: dict, *, role: str, rank: int | None, world_size: int, master_addr: str,
                master_port: int, secret: str, seed: int, training: dict, rate_bps: float,
                log: pathlib.Path | None) -> dict:
    """``base`` with every variable of `ENV` that applies to this process (and no other of them)."""
    env = {k: v for k, v in base.items() if k not in ENV}
    env.update({
        "TESTBED_ROLE": role, "WORLD_SIZE": str(world_size), "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port), "TESTBED_SECRET": secret, "TESTBED_SEED": str(seed),
        "TESTBED_ROUNDS": str(training["rounds"]), "TESTBED_EVAL_EVERY": str(training["eval_every"]),
        "TESTBED_MODEL": training["model"], "TESTBED_BATCH_SIZE": str(training["batch_size"]),
        "TESTBED_LR": str(training["lr"]), "TESTBED_RATE_BPS": str(int(rate_bps)),
    })
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([base["PYTHONPATH"]]
                                                       if base.get("PYTHONPATH") else []))
    if rank is not None:
        env["RANK"] = str(rank)
    if log is not None:
        env["TESTBED_LOG"] = str(log)
    return env


class CommandLog:
    """Reads one worker's $TESTBED_LOG as it grows and writes the raw-log events it means.

    `poll` reads the complete lines written since the last call and returns
    the round events to announce ((``"start"`` | ``"end"``, round)); `finish`
    reads what is left once the process exited and writes the ``end`` event.
    Every problem is a `ContractError` naming ``name`` (the file as the run
    directory shows it) and the line.
    """

    def __init__(self, path: pathlib.Path, out: RunLog, *, name: str, model: str,
                 world_size: int, seed: int, rounds: int, silence_s: float, batch_size: int = 0,
                 lr: float = 0.0, clock=time.monotonic):
        self.path, self.out, self.name = path, out, name
        self.model, self.world_size, self.seed, self.rounds = model, world_size, seed, rounds
        self.batch_size, self.lr = batch_size, lr
        self.silence_s, self.clock = silence_s, clock
        self._offset = 0
        self._partial = b""
        self.line_no = 0
        self.last_line: str | None = None
        self._last_at = clock()
        self.started = False
        self.open: dict | None = None      # the round_start line of the round under way
        self.ended = -1                    # the last round that ended
        self.evals: dict[int, dict] = {}
        self.train_ns = 0
        self.last_eval: dict | None = None
        self.done = False                  # the end event is written

    # -- reading -------------------------------------------------------------
    def poll(self, now: float | None = None) -> list[tuple[str, int]]:
        """Adapt the complete lines written since the last call; fail a worker silent too long."""
        now = self.clock() if now is None else now
        lines = self._read()
        out = []
        for text in lines:
            out += self._line(text)
        if lines:
            self._last_at = now
        elif now - self._last_at > self.silence_s:
            last = (f"its last line, {self.line_no}, was {self.last_line[:120]!r}"
                    if self.last_line is not None else "it wrote no line")
            raise ContractError(f"{self.name}: silent for {now - self._last_at:.0f} s "
                                f"(the arm's silence_s is {self.silence_s:g}); {last}")
        return out

    def _read(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        return [line.decode("utf-8", errors="replace") for line in lines]

    def _fail(self, what: str) -> NoReturn:
        raise ContractError(f"{self.name}:{self.line_no}: {what}")

    def _line(self, text: str) -> list[tuple[str, int]]:
        self.line_no += 1
        if not text.strip():
            return []
        self.last_line = text
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            self._fail(f"not a JSON object ({exc.msg} at column {exc.colno}): {text[:80]!r}")
        kind = obj.get("event") if isinstance(obj, dict) else None
        if kind not in LINES:
            self._fail(f"event {kind!r} is not one of {', '.join(LINES)}" if isinstance(obj, dict)
                       else f"not a JSON object but {type(obj).__name__}")
        try:
            check_fields(obj, LINES[kind], f"{kind} line")
        except MalformedEvent as exc:
            self._fail(str(exc))
        for key in ("t_ns", "round", "params", "grad_bytes", "epoch"):
            if obj.get(key) is not None and obj[key] < 0:
                self._fail(f"{kind} line: field '{key}' is negative ({obj[key]})")
        return getattr(self, "_" + kind)(obj)

    # -- the lines -----------------------------------------------------------
    def _start(self, obj: dict, t_ns: int | None = None) -> list[tuple[str, int]]:
        if self.started:
            self._fail("a second start line (it may come once, before the first round)")
        self.started = True
        self.out.write("start", model=self.model, params=obj.get("params", 0),
                       grad_bytes=obj.get("grad_bytes", 0), world_size=self.world_size,
                       seed=self.seed, t_ns=obj.get("t_ns") or t_ns or time.time_ns(),
                       rounds=self.rounds, **({"batch_size": self.batch_size}
                                              if self.batch_size else {}),
                       **({"lr": self.lr} if self.lr else {}))
        return []

    def _round_start(self, obj: dict) -> list[tuple[str, int]]:
        r = obj["round"]
        if self.open is not None:
            self._fail(f"round_start of round {r} while round {self.open['round']} has not ended")
        if r != self.ended + 1:
            self._fail(f"round_start of round {r}, expected round {self.ended + 1}")
        if r >= self.rounds:
            self._fail(f"round_start of round {r}, but the spec trains {self.rounds} rounds "
                       f"(0..{self.rounds - 1})")
        if not self.started:
            self._start({}, obj["t_ns"])
        self.open = obj
        return [("start", r)]

    def _round_end(self, obj: dict) -> list[tuple[str, int]]:
        r = obj["round"]
        if self.open is None or self.open["round"] != r:
            under_way = f"round {self.open['round']} is under way" if self.open else \
                "no round is under way"
            self._fail(f"round_end of round {r}, but {under_way}")
        t0, t1 = self.open["t_ns"], obj["t_ns"]
        if t1 < t0:
            self._fail(f"round_end of round {r} at t_ns {t1}, before its round_start ({t0})")
        comm = float(obj["comm_s"])
        if not math.isfinite(comm) or comm < 0 or comm > (t1 - t0) / 1e9 + 1e-3:
            self._fail(f"round_end of round {r}: comm_s {comm!r} is not within the round's "
                       f"{(t1 - t0) / 1e9:.3f} s")
        stats = obj.get("stats", {})
        bad = [k for k, v in stats.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            self._fail(f"round_end of round {r}: stats {', '.join(map(repr, bad))} are not numbers")
        cpu = {k: obj[k] for k in ("compute_cpu_s", "comm_cpu_s") if k in obj}
        for k, v in cpu.items():
            if not math.isfinite(v) or v < 0:
                self._fail(f"round_end of round {r}: {k} {v!r} is not a number of seconds")
        self.out.write("round", round=r, epoch=obj.get("epoch", 0), t_start_ns=t0, t_end_ns=t1,
                       compute_s=max(0.0, (t1 - t0) / 1e9 - comm), comm_s=comm, bound=None,
                       phase=None, loss=obj.get("loss"), stats=stats, **cpu)
        self.train_ns += t1 - t0
        self.open, self.ended = None, r
        return [("end", r)]

    def _eval(self, obj: dict) -> list[tuple[str, int]]:
        r, acc = obj["round"], obj["test_accuracy"]
        if r > self.ended:
            self._fail(f"eval of round {r}, which has not ended (the last that ended: "
                       f"{self.ended if self.ended >= 0 else 'none'})")
        if r in self.evals:
            self._fail(f"a second eval of round {r}")
        if acc is not None and not 0 <= acc <= 1:
            self._fail(f"eval of round {r}: test_accuracy {acc!r} is not a fraction in [0, 1]")
        self.evals[r] = obj
        self.last_eval = obj
        self.out.write("eval", round=r, epoch=obj.get("epoch", 0),
                       t_ns=obj.get("t_ns") or time.time_ns(), test_accuracy=acc,
                       test_loss=obj.get("test_loss"))
        return []

    # -- the end -------------------------------------------------------------
    def finish(self, returncode: int | None) -> list[tuple[str, int]]:
        """Adapt what is left, write the ``end`` event; a short or broken log is an error.

        ``returncode``: the process's exit status (None: it was stopped).
        Returns the round events still to announce, as `poll` does.
        """
        events: list[tuple[str, int]] = []
        try:
            for text in self._read(final=True):
                events += self._line(text)
            if returncode == 0:
                if self.open is not None:
                    self._fail(f"the worker exited 0 with round {self.open['round']} not ended")
                if self.ended != self.rounds - 1:
                    self._fail(f"the worker exited 0 after {self.ended + 1} of {self.rounds} "
                               "rounds (its log ends here)")
        except ContractError as exc:
            self.fail(str(exc))
            raise
        if returncode == 0:
            self._end("ok")
        else:
            self.fail("stopped" if returncode is None else f"exit status {returncode}")
        return events

    def fail(self, why: str) -> None:
        """End the adapted log with an error (once; a later call keeps the first reason)."""
        if not self.done:
            self._end("error", why)

    def _end(self, status: str, error: str | None = None) -> None:
        ev = self.last_eval or {}
        fields = {"final_accuracy": ev.get("test_accuracy"),
                  "final_loss": ev.get("test_loss")} if status == "ok" else {"error": error}
        self.out.write("end", status=status, train_time_s=self.train_ns / 1e9, **fields)
        self.out.close()
        self.done = True


def log_paths(unit_raw: pathlib.Path, rank: int) -> tuple[pathlib.Path, pathlib.Path]:
    """(the command's own log, the adapted raw log) of worker ``rank`` in a unit's directory."""
    return unit_raw / COMMAND_LOG.format(rank=rank), unit_raw / f"worker{rank}.jsonl"

