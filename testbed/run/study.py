"""A study: many `run`s of one preset declared together, resumable, with a plan file and a report.

`dblp-testbed ablate` (`testbed.run.ablation`) and `dblp-testbed regime`
(`testbed.run.regime`) are two studies: each declares its parts (the
ablation's points, the map's cells) and what its plan file says about them;
this base runs the parts not yet done (`testbed.run.batch`), keeps the plan
file current, refuses a directory that holds another study, reads the plan
back, drives the command line and regenerates a reference
(``testbed.run.reproduce.StudyReference``) the same way for both.
"""
from __future__ import annotations

import abc
import dataclasses
import importlib
import pathlib
import time
from collections.abc import Callable
from typing import ClassVar

import click

from testbed import output
from testbed.errors import ExperimentFailed, InputError
from testbed.output import results
from testbed.run import batch

#: The tables of each part a reference keeps beside the study's own outputs.
RAW_TABLES = ("rounds.csv", "evals.csv")


@dataclasses.dataclass(frozen=True)
class Part:
    """One run of a study: its directory name, its `--set` overrides, its plan entry."""

    name: str
    overrides: tuple[str, ...]
    entry: dict
    source: object = None    # the declared piece it comes from (a point, a cell)


class Study(abc.ABC):
    """The base of a declared study; subclasses are frozen dataclasses with ``name`` and ``preset``.

    A subclass says what it is called (``command``, ``noun``, ``part_noun``,
    ``plan_key``), where its plan goes (``plan_file``, ``plan_schema``), which
    module analyses it (``analysis``), and implements `parts`, `select`,
    `part_spec`, `plan_fields` and `kept_files`.
    """

    command: ClassVar[str]        # the `dblp-testbed` command: "ablate", "regime"
    noun: ClassVar[str]           # what one study is called in messages: "ablation", "regime map"
    part_noun: ClassVar[str]      # what one run is called in messages: "run", "cell"
    plan_key: ClassVar[str]       # the plan file's key naming the study: "ablation", "map"
    plan_file: ClassVar[str]      # "ablation.json", "regime.json"
    plan_schema: ClassVar[int]    # its version
    plan_rerun: ClassVar[str]     # what to do with a plan of another version
    analysis: ClassVar[str]       # the module with write(out, plan) and text(doc)
    registry: ClassVar[dict]      # the declared studies of this kind, by name (`register`)

    name: str
    preset: str

    # ------------------------------------------------------------------ declared by each study
    @abc.abstractmethod
    def parts(self, only: tuple[str, ...] = ()) -> list[Part]:
        """The runs of ``only`` (by the study's own names; all when empty), in order."""

    @abc.abstractmethod
    def select(self, only: tuple[str, ...]) -> tuple:
        """The declared pieces called ``only``; an unknown name is one InputError line."""

    @abc.abstractmethod
    def part_spec(self, part: Part):
        """The resolved spec of one part."""

    @abc.abstractmethod
    def plan_fields(self) -> dict:
        """What the plan file says about the study besides its name, schema and runs."""

    @abc.abstractmethod
    def kept_files(self) -> tuple[str, ...]:
        """The files of its directory a reference keeps (its own, then `raw_files`)."""

    def raw_files(self) -> tuple[str, ...]:
        """Each part's rounds and evaluations (``PART/rounds.csv``, ``PART/evals.csv``):
        kept with a reference so that every figure its tables show can be recomputed
        from the rounds that made it, not only read from its summary."""
        return tuple(f"{p.name}/{table}" for p in self.parts() for table in RAW_TABLES)

    def prepare(self, out: pathlib.Path) -> None:
        """Work before the runs (the ablation's loss-tolerance sweep); nothing by default."""
        return None

    # ------------------------------------------------------------------ shared
    @classmethod
    def register(cls, study: Study) -> Study:
        """Add ``study`` to the registry; a different study under a taken name is refused."""
        if study.name in cls.registry and cls.registry[study.name] != study:
            raise ValueError(f"{cls.noun} {study.name!r} is already registered")
        cls.registry[study.name] = study
        return study

    def execute(self, out: pathlib.Path, only: tuple[str, ...] = (),
                run_fn: Callable | None = None) -> dict:
        """Run every part not yet done; return the plan with each run's status and wall time.

        ``run_fn(spec, out_dir) -> status`` runs one experiment (run and analysis:
        `testbed.run.experiment.run_and_report`; tests pass their own). Every part's spec is
        resolved before the first run. Resuming: `testbed.run.batch`.
        """
        out.mkdir(parents=True, exist_ok=True)
        plan_file = out / self.plan_file
        parts = self.parts(only)
        planned = [batch.PlannedRun(p.name, p.overrides, self.part_spec(p)) for p in parts]
        entry = {p.name: p.entry for p in parts}
        done: dict[str, dict] = {}
        if plan_file.is_file():
            old = self.read_plan(out)
            if old[self.plan_key] != self.name:
                raise InputError(f"{out} holds {self.noun} {old[self.plan_key]!r}, not "
                                 f"{self.name!r}; give another --out")
            done = old["runs"]
        self.prepare(out)

        def record(name: str, how: dict) -> None:
            done[name] = {**entry[name], **how}
            self._write_plan(plan_file, done)

        batch.run_pending(f"{self.command} {self.name}", planned, out, run_fn, record)
        for p in parts:  # runs finished before this invocation keep their record
            done.setdefault(p.name, {**p.entry, "status": batch.status(out / p.name),
                                     "wall_s": None})
        self._write_plan(plan_file, done)
        return self.read_plan(out)

    def _write_plan(self, path: pathlib.Path, runs: dict) -> None:
        batch.write_json(path, {"schema": self.plan_schema, self.plan_key: self.name,
                                **self.plan_fields(), "runs": runs})

    @classmethod
    def read_plan(cls, out: pathlib.Path) -> dict:
        """The plan file of ``out``; a missing file or unknown schema is one InputError line."""
        from testbed.analysis.formats import read_versioned

        return read_versioned(pathlib.Path(out) / cls.plan_file, cls.plan_schema,
                              f"run `dblp-testbed {cls.command} NAME --out {out}` first",
                              cls.plan_rerun)

    def write_outputs(self, out: pathlib.Path, plan: dict) -> dict:
        """The study's tables, report and plots from its plan (its analysis module)."""
        return importlib.import_module(self.analysis).write(out, plan)

    def failed(self, plan: dict) -> list[str]:
        return sorted(n for n, r in plan["runs"].items() if r["status"] != "ok")


def run_command(kind: type[Study], name: str, out: str | None, only: tuple[str, ...],
                report_only: bool, json_out) -> None:
    """What `ablate` and `regime` do: run (or only report) the ``kind`` of study called ``name``."""
    if name not in kind.registry:
        raise InputError(f"unknown {kind.noun} {name!r}; choose from {', '.join(kind.registry)}")
    study = kind.registry[name]
    study.select(tuple(only))  # an unknown part fails before anything runs
    if out is None:
        if report_only:
            raise InputError(f"--report-only needs --out DIR (the {study.noun}'s directory)")
        out = f"results/{study.command}-{name}-{time.strftime('%Y%m%dT%H%M%S')}"
    out_dir = pathlib.Path(out)
    t0 = time.monotonic()
    plan = study.read_plan(out_dir) if report_only else study.execute(out_dir, tuple(only))
    doc = study.write_outputs(out_dir, plan)
    if not report_only:
        output.say(f"{study.command} {name}: {time.monotonic() - t0:.0f} s")
    failed = study.failed(plan)
    analysis = importlib.import_module(study.analysis)
    results(doc, json_out, lambda: click.echo(analysis.text(doc)))
    if failed:
        raise ExperimentFailed(f"{study.noun} {study.part_noun}(s) {', '.join(failed)} did not "
                               f"finish (see {out_dir}/<{study.part_noun}>/manifest.json); rerun "
                               "the same command to retry only those")
