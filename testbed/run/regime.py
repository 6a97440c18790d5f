"""`dblp-testbed regime`: the burst regime map, one `run` per cell.

Why a map: one burst setting gives one ratio, and the paper's 1.68x and
5.88x are both "the speedup at burst rounds" under different conditions. A
cell of the map is one burst regime: how long a burst lasts (a fixed number
of milliseconds from the start of its round, every arm alike, or
round-locked: on for the round it hits, cut at ``CAP_MS``), how much it
drops, which control path the bounded arms use, and where and how it acts
(the server's downlink by default; its uplink, which the pull and the union
repair cross; the core links; a queue-overflow ``congest`` burst instead of
random drop). Each cell runs every arm of its control path on the default
preset's fat-tree and workload, with at least ``MIN_BURSTS`` bursts.

Why the arms are the two bounds and not DBLP itself: DBLP runs one of two
static bounds each round (P_low when its detector calls the phase critical,
P_high otherwise), and which one is the detector's business, measured by
the detector ablation (`dblp-testbed ablate detector`). A cell therefore
runs both bounds, ``static`` (P_low) and ``static-high`` (P_high), in the
parameter-server and the sharded mode, beside gloo: what DBLP gains in a
burst it meets relaxed is the cell's loose-vs-tight ratio, and the map
needs no rounds spent waiting for a phase check (a parameter-server round
of the fat-tree takes about 3.5 s, so ten such rounds per arm and cell
would double the map).

The analysis (`testbed.analysis.regime`) places every cell's burst-round
speedup between the bandwidth-bound and the pass-bound ratio and each
arm's latency over its physical bound; a figure where a round-locked burst
ran to its cap is flagged by the run's own tables and never reported as a
speedup. A map is a `testbed.run.study.Study`: long work is resumable
(`testbed.run.batch`), and ``regime.json`` in the output directory holds the
plan and how each cell's run ended.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import click

from controllers.bursts import KINDS
from testbed.errors import InputError
from testbed.output import json_option
from testbed.run.study import Part, Study, run_command

#: Version of regime.json (the plan and how each cell's run ended).
#: 1: first version.
PLAN_SCHEMA = 1
#: A round-locked burst's cap (ms): long enough that a 90 % burst on a
#: parameter-server round of the fat-tree ends with its round, not the cap.
CAP_MS = 8000.0
#: Bursts per cell (a map may ask for fewer: the smoke map's check), one
#: every ``EVERY`` rounds from ``FIRST``: a clean round
#: between two bursts (a 1 s burst ends inside the next round only for the
#: sharded arms, whose rounds are under a second, and never covers half of it).
MIN_BURSTS, EVERY, FIRST = 5, 2, 2
#: The arms of a cell by control path (module docstring: the two bounds DBLP
#: switches between). gloo has no control path of its own: it runs in the
#: UDP cells, where the sharded transport is its like-for-like peer.
ARMS = {"udp": ("static", "static-high", "gloo", "static-sharded", "static-high-sharded"),
        "tcp": ("static-tcp", "static-high-tcp")}
#: Burst durations: ms from the start of the round, or ``ROUND`` (round-locked).
ROUND = "round"


@dataclasses.dataclass(frozen=True)
class Cell:
    """One burst regime: duration, drop probability, control path, target, kind."""

    duration: float | str      # ms, or ROUND
    p: float                   # drop probability of a loss burst
    control: str               # "udp" | "tcp": the bounded arms' control path
    target: str = "server-downlink"
    kind: str = "loss"         # a burst kind (controllers.kinds): "loss" (random drop), "congest"...
    #: Only these of the map's arms (None: all of the control path's): where a
    #: burst acts is a question about the parameter server's paths.
    only: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        """The cell's directory: ``CONTROL-DURATION-pPCT[-TARGET]``, or ``-KIND`` for a kind without p."""
        d = "round" if self.duration == ROUND else f"{self.duration:g}ms"
        takes_p = "p" in KINDS[self.kind].params
        parts = [self.control, d, f"p{round(self.p * 100):d}" if takes_p else self.kind]
        if self.target != "server-downlink":
            parts.append(self.target)
        return "-".join(parts)

    def overrides(self, arms: tuple[str, ...]) -> list[str]:
        locked = self.duration == ROUND
        return [f"arms={','.join(arms)}",
                f"burst_every.duration_ms={0 if locked else self.duration}",
                f"burst_every.max_ms={CAP_MS}", f"burst_every.p={self.p}",
                f"burst_every.target={self.target}", f"burst_every.kind={self.kind}"]

    def arms(self, of_map: dict) -> tuple[str, ...]:
        return self.only if self.only is not None else tuple(of_map[self.control])

    def as_dict(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class RegimeMap(Study):
    """A declared set of cells on one preset, with the overrides every cell shares."""

    command: ClassVar[str] = "regime"
    noun: ClassVar[str] = "regime map"
    part_noun: ClassVar[str] = "cell"
    plan_key: ClassVar[str] = "map"
    plan_file: ClassVar[str] = "regime.json"
    plan_schema: ClassVar[int] = PLAN_SCHEMA
    plan_rerun: ClassVar[str] = "rerun the map with this version"
    analysis: ClassVar[str] = "testbed.analysis.regime"
    registry: ClassVar[dict] = {}

    name: str
    preset: str
    cells: tuple[Cell, ...]
    doc: str
    seeds: int = 1
    bursts: int = MIN_BURSTS
    overrides: tuple[str, ...] = ()
    arms: dict = dataclasses.field(default_factory=lambda: dict(ARMS), compare=False)

    def shared(self) -> list[str]:
        """What every cell sets: seeds, rounds, the burst schedule, one evaluation at the end.

        The preset's scheduled ``bursts`` are dropped (`spec`): only the cell's bursts hit.
        """
        rounds = FIRST + EVERY * (self.bursts - 1) + 2
        return [f"seeds={self.seeds}", f"training.rounds={rounds}",
                f"training.eval_every={rounds}", "burst_every.enabled=true",
                f"burst_every.every={EVERY}", f"burst_every.start_round={FIRST}",
                *self.overrides]

    def spec(self, cell: Cell):
        from testbed.config import spec as specmod
        from testbed.config.presets import PRESETS

        # The preset's own scheduled bursts give way to the cell's (`bursts` is
        # a list of tables, not a `--set` field).
        base = {**PRESETS[self.preset], "bursts": []}
        return specmod.load(None, base, [*self.shared(), *cell.overrides(cell.arms(self.arms))])

    def select(self, names: tuple[str, ...]) -> tuple[Cell, ...]:
        if not names:
            return self.cells
        known = {c.name: c for c in self.cells}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InputError(f"regime map {self.name} has no cell {unknown[0]!r}; "
                             f"choose from {', '.join(known)}")
        return tuple(known[n] for n in names)

    def parts(self, only: tuple[str, ...] = ()) -> list[Part]:
        return [Part(c.name, tuple(c.overrides(c.arms(self.arms))), {"cell": c.as_dict()}, c)
                for c in self.select(only)]

    def part_spec(self, part: Part):
        return self.spec(part.source)

    def plan_fields(self) -> dict:
        return {"preset": self.preset, "seeds": self.seeds, "shared_overrides": self.shared(),
                "cap_ms": CAP_MS, "arms": {k: list(v) for k, v in self.arms.items()},
                "cells": [c.as_dict() for c in self.cells]}

    def kept_files(self) -> tuple[str, ...]:
        return ("regime.json", "regime-summary.json", "cells.csv", "arms.csv", "report.md",
                "plots/regime-speedup.png", "plots/regime-over-bound.png", *self.raw_files())


def _grid(durations, losses, controls) -> tuple[Cell, ...]:
    return tuple(Cell(d, p, c) for c in controls for d in durations for p in losses)


#: Where a burst acts and how, beyond random drop on the server's downlink:
#: the pull path (the server's uplink: every worker's pull and the union
#: repair), the core links, and queue overflow (`congest`) instead of drop.
PLACES = (Cell(1000.0, 0.6, "udp", target="server-uplink"),
          Cell(1000.0, 0.6, "udp", target="core-uplinks"),
          Cell(1000.0, 0.6, "udp", kind="congest"))

MAPS: dict[str, RegimeMap] = RegimeMap.registry
register = RegimeMap.register


register(RegimeMap(
    "full", "default",
    _grid((50.0, 200.0, 1000.0, ROUND), (0.3, 0.6, 0.9), ("udp", "tcp")) + PLACES,
    doc="every duration (50, 200, 1000 ms, round-locked) x loss (30, 60, 90 %) x control "
        "(UDP, TCP), plus the pull path, the core links and congest: 27 cells, over an hour"))
#: The parameter server's arms and gloo: the reduced map's cells on where a burst acts.
PS_ARMS = ("static", "static-high", "gloo")
register(RegimeMap(
    "reduced", "default",
    (Cell(200.0, 0.9, "udp"), Cell(1000.0, 0.9, "udp"), Cell(ROUND, 0.6, "udp"),
     Cell(1000.0, 0.9, "tcp"), Cell(ROUND, 0.6, "tcp"),
     Cell(1000.0, 0.9, "udp", target="server-uplink", only=PS_ARMS),
     Cell(1000.0, 0.9, "udp", target="core-uplinks", only=PS_ARMS),
     Cell(1000.0, 0.9, "udp", kind="congest", only=PS_ARMS)),
    doc="the corners that decide who wins: 200 ms and 1 s bursts of 90 % and round-locked "
        "60 % ones on both control paths, the pull path, the core links and congest; at most "
        "30 minutes"))
register(RegimeMap(
    "smoke", "smoke", (Cell(ROUND, 0.9, "udp"),), bursts=2,
    overrides=("capture.enabled=false",),
    arms={"udp": ("static", "static-high"), "tcp": ("static-tcp", "static-high-tcp")},
    doc="one round-locked cell on the smoke preset's star, two arms, two bursts: the "
        "command's own check (about a minute)"))


@click.command("regime")
@click.argument("name", default="reduced")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output directory (resumed if it holds this map). "
                   "Default: results/regime-NAME-TIME.")
@click.option("--cell", "cells", multiple=True,
              help="Only this cell (by name, e.g. udp-1000ms-p90; repeatable). Default: every cell.")
@click.option("--report-only", is_flag=True, help="Run nothing: rebuild the table and heat-maps.")
@json_option
def regime_cmd(name, out, cells, report_only, json_out):
    """The burst regime map: burst duration x loss x control path (and where bursts act).

    Maps: reduced (eight cells, at most 30 minutes), full (27 cells, over an hour),
    smoke (one cell on the star, about a minute).
    """
    run_command(RegimeMap, name, out, tuple(cells), report_only, json_out)
