"""`dblp-testbed ablate`: one setting of one arm varied over runs, everything else held.

Why runs and not arms: a point of a sweep is the same arm with one setting
changed (DBLP at another P_high, another threshold), and a spec gives every
arm the same transport settings. So each point is its own `run` of the same
preset, seeds and burst schedule, with one `--set` added, and only the
varied arm runs there; the baselines (and the varied arm at the preset's own
settings, every axis's shared point) run once, in the ``base`` run. The
analysis (`testbed.analysis.ablation`) joins the runs' tables, labels each
point's arm ``ARM@SETTING=VALUE`` and compares every point with the
baselines by the same estimators and intervals as a run's verdicts.

An ablation is a `testbed.run.study.Study`: long work is resumable
(`testbed.run.batch`: a finished point is not run again, an unfinished one
keeps its directory before it is retried), and `ablation.json` in the output
directory says what was asked and how each run ended.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import ClassVar

import click

from testbed import output
from testbed.errors import InputError
from testbed.output import json_option
from testbed.run.study import Part, Study, run_command

#: Version of ablation.json (the plan and how each run ended).
#: 1: first version.
PLAN_SCHEMA = 1
#: The directory of the run that holds the baselines and the shared point.
BASE = "base"
#: The directory of the loss-tolerance sweep, and its drop window (share of the rounds).
HARM = "harm"
HARM_WINDOW = 0.25


@dataclasses.dataclass(frozen=True)
class Axis:
    """One spec setting and the values a sweep gives it."""

    setting: str              # SECTION.FIELD, as `--set` takes it
    values: tuple             # the points, the preset's own value among them
    label: str                # how tables and plots name it

    @property
    def field(self) -> str:
        return self.setting.rsplit(".", 1)[-1]

    def point(self, value) -> str:
        """The point's directory name and arm suffix: ``FIELD=VALUE``."""
        return f"{self.field}={value}"


@dataclasses.dataclass(frozen=True)
class Ablation(Study):
    """A declared sweep: the preset, the varied arm, the baselines, the axes and seeds."""

    command: ClassVar[str] = "ablate"
    noun: ClassVar[str] = "ablation"
    part_noun: ClassVar[str] = "run"
    plan_key: ClassVar[str] = "ablation"
    plan_file: ClassVar[str] = "ablation.json"
    plan_schema: ClassVar[int] = PLAN_SCHEMA
    plan_rerun: ClassVar[str] = "rerun the ablation with this version"
    analysis: ClassVar[str] = "testbed.analysis.ablation"
    registry: ClassVar[dict] = {}

    name: str
    preset: str
    arm: str
    baselines: tuple[str, ...]
    axes: tuple[Axis, ...]
    seeds: int
    doc: str
    overrides: tuple[str, ...] = ()
    #: Also run the loss-tolerance sweep (`workloads.sweep`, no network) on the
    #: preset's model, workers, rounds and seeds, dropping the preset's P_high
    #: early, in the middle or late: where drops actually hurt, against which
    #: the analysis draws where the detector called critical.
    harm: bool = False

    def base_value(self, axis: Axis):
        """The preset's own value of ``axis`` (the base run's point on it)."""
        spec = self.spec([])
        section, field = axis.setting.split(".", 1)
        return spec[section][field]

    def spec(self, extra: list[str] | tuple[str, ...]):
        """The preset with the ablation's overrides and seeds, then ``extra``."""
        from testbed.config import spec as specmod
        from testbed.config.presets import PRESETS

        return specmod.load(None, PRESETS[self.preset],
                            [*self.overrides, f"seeds={self.seeds}", *extra])

    def part_spec(self, part: Part):
        return self.spec(part.overrides)

    def parts(self, only: tuple[str, ...] = ()) -> list[Part]:
        return [Part(r.name, tuple(r.overrides),
                     {"overrides": r.overrides, "setting": r.setting, "value": r.value}, r)
                for r in self.runs(only)]

    def plan_fields(self) -> dict:
        return {"preset": self.preset, "arm": self.arm, "baselines": list(self.baselines),
                "seeds": self.seeds, "overrides": list(self.overrides),
                "axes": [{"setting": a.setting, "label": a.label, "values": list(a.values),
                          "base": self.base_value(a)} for a in self.axes]}

    def kept_files(self) -> tuple[str, ...]:
        fields = [a.field for a in self.axes]
        return ("ablation.json", "ablation-summary.json", "points.csv", "report.md",
                *[f"plots/{kind}-{f}.png" for f in fields for kind in ("ablation", "phases")],
                *self.raw_files())

    def prepare(self, out: pathlib.Path) -> None:
        if self.harm:
            _harm(self, out / HARM)

    def runs(self, axes: tuple[str, ...] = ()) -> list[Run]:
        """The runs, base first: each point not equal to the preset's own value, axis by axis."""
        chosen = self.select(axes)
        out = [Run(BASE, [f"arms={','.join((*self.baselines, self.arm))}"], None, None)]
        for axis in chosen:
            here = self.base_value(axis)
            for v in axis.values:
                if v != here:
                    out.append(Run(axis.point(v), [f"arms={self.arm}", f"{axis.setting}={v}"],
                                   axis.setting, v))
        return out

    def select(self, axes: tuple[str, ...]) -> tuple[Axis, ...]:
        if not axes:
            return self.axes
        known = {a.field: a for a in self.axes}
        unknown = [a for a in axes if a not in known]
        if unknown:
            raise InputError(f"ablation {self.name} has no axis {unknown[0]!r}; "
                             f"choose from {', '.join(known)}")
        return tuple(known[a] for a in axes)


@dataclasses.dataclass(frozen=True)
class Run:
    """One `run` of an ablation: its directory name and the overrides that make it."""

    name: str
    overrides: list[str]
    setting: str | None
    value: object


ABLATIONS: dict[str, Ablation] = Ablation.registry
register = Ablation.register


# The detector's sweep, on the paper's set-up (star, 100 Mbit/s, the
# parameter server, 20 one-second bursts): a dblp unit there takes about
# 1.5 min against 3.5 on the default fat-tree, so three seeds of every point
# fit in an hour. P_high runs from P_low + 10 to + 80 points (the paper's
# choice is + 40); the threshold from 0.1 to 0.9 (the paper's 0.5); the
# signal is the drop-corrected one against the paper's zero-filled norm.
register(Ablation(
    "detector", "paper", "dblp", ("static", "static-high"),
    (Axis("transport.p_high", (0.108, 0.208, 0.408, 0.608, 0.808), "P_high"),
     Axis("transport.threshold", (0.1, 0.3, 0.5, 0.7, 0.9), "threshold"),
     Axis("transport.signal", ("delivered", "rescaled"), "signal")),
    seeds=3, harm=True,
    doc="DBLP's relaxed bound, phase threshold and detector signal, each varied alone on the "
        "paper's set-up, against static (P_low) and static-high (P_high)"))
# Seconds per point: for tests and a first look (the smoke preset's star).
register(Ablation(
    "smoke", "smoke", "dblp", ("static",),
    (Axis("transport.p_high", (0.208, 0.408), "P_high"),),
    seeds=1, overrides=("training.rounds=8", "training.eval_every=4", "capture.enabled=false"),
    doc="two points of P_high on the smoke preset, eight rounds: the command's own check"))


def _harm(ab: Ablation, out: pathlib.Path):
    """The loss-tolerance sweep of the preset's workload (skipped when done before)."""
    if (out / "sweep.json").is_file():
        output.say(f"ablate {ab.name}: the loss-tolerance sweep was done before ({out})")
        return
    import torch

    from workloads.sweep import PHASES, run_sweep

    spec = ab.spec([])
    tr = spec["training"]
    output.say(f"ablate {ab.name}: loss-tolerance sweep of {tr['model']} (no network; "
               f"{spec['placement']['workers']} workers, {tr['rounds']} rounds, "
               f"seeds {spec.seed_values}) -> {out}")
    torch.set_num_threads(1)  # as each worker has
    run_sweep(str(out), tr["model"], spec["placement"]["workers"], tr["rounds"],
              (0.0, spec["transport"]["p_high"]), PHASES, HARM_WINDOW, spec.seed_values,
              eval_every=tr["eval_every"], log=output.detail)


@click.command("ablate")
@click.argument("name", default="detector")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output directory (resumed if it holds this ablation). "
                   "Default: results/ablate-NAME-TIME.")
@click.option("--axis", "axes", multiple=True,
              help="Only this axis (by field, e.g. p_high; repeatable). Default: every axis.")
@click.option("--report-only", is_flag=True, help="Run nothing: rebuild the tables and plots.")
@json_option
def ablate_cmd(name, out, axes, report_only, json_out):
    """Vary one setting of one arm over runs (same preset, seeds, bursts): NAME's axes.

    Ablations: detector (P_high, threshold, signal of DBLP on the paper's
    set-up; 3 seeds, about an hour), smoke (seconds per point).
    """
    run_command(Ablation, name, out, tuple(axes), report_only, json_out)
