"""A unit's training settings, declared once: the ``training.json`` its processes read.

Why a file: a setting travels between processes as a serialized file in
the run directory, never as a string to be parsed again (docs/architecture.md).
The harness's built-in launcher (``testbed.run.builtinlauncher``) writes one
per unit, ``raw/<arm>/seed-<seed>/training.json`` beside the unit's
``transport.json``, from the spec's ``[training]`` section and the unit's
seed; the server and every worker of the unit read that same file
(``--training-config PATH``), so no two of them can disagree on a round
count or a batch size, and the unit's directory says what it trained.

A person who starts a worker or a server by hand (torchrun, a debugger,
the tests that kill a peer) gives flags instead (``--rounds``, ``--lr`` ...):
they build the same `TrainingSettings`, with the same checks. A process
takes its settings from one source, the file or its flags, never a mix
(`from_args`), so a flag can never quietly override what the harness wrote.

This module imports nothing but the standard library: the harness writes
the file without importing torch. Which models exist is the worker's
registry's (``workloads.models.MODELS``), so `from_args` takes it from the reader.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Collection, Sequence

#: Version of the file's format; a reader refuses any other (as ``transport.json``'s does).
SCHEMA = 1
#: The file's name in a unit's directory, beside ``dblp.config.CONFIG_FILE`` (``transport.json``).
TRAINING_FILE = "training.json"
#: The model a worker trains when nobody names one (the spec's default too).
DEFAULT_MODEL = "digits_cnn"
#: The learning-rate schedules ``workloads.models.make_scheduler`` implements.
LR_SCHEDULES = ("constant", "cosine")
DEFAULT_ROUNDS = 300
DEFAULT_EVAL_EVERY = 25
#: How `TrainingSettings.describe` shows a setting left to the model (None).
_MODELS_OWN = "(the model's)"


class SettingError(ValueError):
    """One setting is wrong: ``key`` names it, so each reader can say where it came from
    (a key of the file, or the flag a user typed)."""

    def __init__(self, key: str, problem: str):
        self.key = key
        self.problem = problem
        super().__init__(f"key {key!r}: {problem}")


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """What one unit trains, the same for its server and every worker.

    The defaults are what a worker started by hand without flags trains;
    the harness always writes every field.
    """

    #: The model of ``workloads.models`` to train. The server needs it too: it fixes the
    #: gradient's size, which the server logs, and the data whose epochs it counts.
    model: str = DEFAULT_MODEL
    #: Training steps, one gradient exchange each; the server serves exactly as many rounds,
    #: so a server and workers that disagreed here would hang the unit's last round.
    rounds: int = DEFAULT_ROUNDS
    #: The unit's seed: model init, shards and batch order. Every arm trained with one seed
    #: starts from the same weights and sees the same batches, so only the exchange differs.
    seed: int = 0
    #: Learning rate; None: the model's own (``workloads.models``), the one it converges with.
    lr: float | None = None
    #: ``constant``, or ``cosine`` decay to zero over `rounds`: annealing takes the last
    #: evaluations' noise away, so two arms' final accuracies compare within a point.
    lr_schedule: str = "constant"
    #: Per-worker batch; None: the model's own. The server needs it too: ``check_every =
    #: "epoch"`` and the round log's epoch count the rounds one worker's shard takes.
    batch_size: int | None = None
    #: Evaluate after every this many rounds, and always after the last; 0: after the last
    #: only. Evaluation is compute between rounds, so the spec keeps it sparse.
    eval_every: int = DEFAULT_EVAL_EVERY

    def __post_init__(self):
        _check_int("rounds", self.rounds, 1)
        _check_int("seed", self.seed, 0)
        _check_int("eval_every", self.eval_every, 0)
        if self.batch_size is not None:
            _check_int("batch_size", self.batch_size, 1)
        if not isinstance(self.model, str) or not self.model:
            raise SettingError("model", f"must be a model's name, got {self.model!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise SettingError("lr_schedule", f"must be one of {', '.join(LR_SCHEDULES)}, "
                                              f"got {self.lr_schedule!r}")
        if self.lr is not None:
            lr = self.lr
            if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < float("inf"):
                raise SettingError("lr", f"must be a positive number or null (the model's), "
                                         f"got {lr!r}")
            object.__setattr__(self, "lr", float(lr))   # 1 and 1.0 are one rate, one file

    # -- the file -----------------------------------------------------------------------
    def to_json(self) -> str:
        """JSON with a ``schema`` version; ``from_json(to_json(s)) == s``."""
        return json.dumps({"schema": SCHEMA, **dataclasses.asdict(self)}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> TrainingSettings:
        """Parse `to_json`'s output: every key, nothing else, this schema only. The error
        names the first key that is wrong, unknown or missing, in one line."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError("must be a JSON object")
        schema = doc.pop("schema", None)
        if schema != SCHEMA:
            raise SettingError("schema", f"{schema!r} is not supported (this reader reads {SCHEMA})")
        keys = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(doc) - set(keys))
        if unknown:
            raise SettingError(unknown[0], f"unknown (the keys are schema, {', '.join(keys)})")
        missing = [k for k in keys if k not in doc]
        if missing:
            raise SettingError(missing[0], "missing (the harness writes every key)")
        return cls(**doc)

    def write(self, path: str | os.PathLike) -> None:
        """Write `to_json` to ``path``, whole or not at all (a reader never sees half a file)."""
        path = os.fspath(path)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            fh.write(self.to_json() + "\n")
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: str | os.PathLike) -> TrainingSettings:
        """Read a file `write` made; any error is one line naming the file (and the key)."""
        try:
            with open(path, "rb") as fh:
                text = fh.read()
        except OSError as exc:
            raise ValueError(f"{os.fspath(path)}: cannot read it: {exc.strerror}") from None
        try:
            return cls.from_json(text)
        except ValueError as exc:
            raise ValueError(f"{os.fspath(path)}: {exc}") from None

    def describe(self) -> str:
        """One line for a process's output: every setting it trains with."""
        return " ".join(f"{k}={_MODELS_OWN if v is None else v}"
                        for k, v in dataclasses.asdict(self).items())


def _check_int(key: str, value, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise SettingError(key, f"must be an integer >= {lo}, got {value!r}")


def flag(key: str) -> str:
    """The command-line flag of a setting: ``batch_size`` -> ``--batch-size``."""
    return "--" + key.replace("_", "-")


def add_config_argument(parser) -> None:
    """``--training-config PATH``, for the worker and the server."""
    parser.add_argument("--training-config", default=None, metavar="PATH",
                        help=f"a {TRAINING_FILE} file (RUN/raw/<arm>/seed-<seed>/{TRAINING_FILE}, "
                             "written by the harness) with every training setting; "
                             "without it, the flags below (and their defaults)")


def from_args(args, keys: Sequence[str], models: Collection[str]) -> TrainingSettings:
    """A process's settings: its ``--training-config`` file, or else the flags it was given.

    ``keys``: the settings the entry point takes as flags (``args.<key>``, None where
    not given); ``models``: the model names the reader can build. Any problem is a
    one-line `SystemExit` naming the file and key, or the flag.
    """
    given = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    path = args.training_config
    if path is not None:
        if given:
            raise SystemExit(f"{flag(next(iter(given)))}: the training settings come from "
                             f"--training-config {path}; give the file or the flags, not both")
        try:
            settings = TrainingSettings.read(path)
        except ValueError as exc:
            raise SystemExit(f"--training-config {exc}") from None
        where = f"--training-config {path}: key 'model'"
    else:
        try:
            settings = TrainingSettings(**given)
        except SettingError as exc:
            raise SystemExit(f"{flag(exc.key)}: {exc.problem}") from None
        where = "--model"
    if settings.model not in models:
        raise SystemExit(f"{where}: {settings.model!r} is not one of {', '.join(sorted(models))}")
    return settings
