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
speedup. Long work is resumable (`testbed.run.batch`); ``regime.json`` in
the output directory holds the plan and how each cell's run ended.
"""
from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Callable

import click

from testbed import output
from testbed.errors import ExperimentFailed, InputError
from testbed.output import json_option, results
from testbed.run import batch

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
    kind: str = "loss"         # "loss" (random drop) | "congest" (queue overflow)
    #: Only these of the map's arms (None: all of the control path's): where a
    #: burst acts is a question about the parameter server's paths.
    only: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        """The cell's directory: ``CONTROL-DURATION-pPCT[-TARGET][-KIND]``."""
        d = "round" if self.duration == ROUND else f"{self.duration:g}ms"
        parts = [self.control, d, f"p{round(self.p * 100):d}" if self.kind == "loss" else self.kind]
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
class RegimeMap:
    """A declared set of cells on one preset, with the overrides every cell shares."""

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


def _grid(durations, losses, controls) -> tuple[Cell, ...]:
    return tuple(Cell(d, p, c) for c in controls for d in durations for p in losses)


#: Where a burst acts and how, beyond random drop on the server's downlink:
#: the pull path (the server's uplink: every worker's pull and the union
#: repair), the core links, and queue overflow (`congest`) instead of drop.
PLACES = (Cell(1000.0, 0.6, "udp", target="server-uplink"),
          Cell(1000.0, 0.6, "udp", target="core-uplinks"),
          Cell(1000.0, 0.6, "udp", kind="congest"))

MAPS: dict[str, RegimeMap] = {}


def register(m: RegimeMap) -> RegimeMap:
    if m.name in MAPS and MAPS[m.name] != m:
        raise ValueError(f"regime map {m.name!r} is already registered")
    MAPS[m.name] = m
    return m


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


def execute(m: RegimeMap, out: pathlib.Path, cells: tuple[str, ...] = (),
            run_fn: Callable | None = None) -> dict:
    """Run every cell not yet done; return the plan with each cell's status and wall time."""
    out.mkdir(parents=True, exist_ok=True)
    plan_file = out / "regime.json"
    chosen = m.select(cells)
    planned = [batch.PlannedRun(c.name, tuple(c.overrides(c.arms(m.arms))), m.spec(c))
               for c in chosen]
    done: dict[str, dict] = {}
    if plan_file.is_file():
        old = read_plan(out)
        if old["map"] != m.name:
            raise InputError(f"{out} holds regime map {old['map']!r}, not {m.name!r}; "
                             "give another --out")
        done = old["runs"]
    cell_of = {c.name: c for c in m.cells}

    def record(name: str, how: dict) -> None:
        done[name] = {"cell": cell_of[name].as_dict(), **how}
        _write_plan(plan_file, m, done)

    batch.run_pending(f"regime {m.name}", planned, out, run_fn, record)
    for c in chosen:
        done.setdefault(c.name, {"cell": c.as_dict(), "status": batch.status(out / c.name),
                                 "wall_s": None})
    _write_plan(plan_file, m, done)
    return read_plan(out)


def _write_plan(path: pathlib.Path, m: RegimeMap, runs: dict) -> None:
    batch.write_json(path, {
        "schema": PLAN_SCHEMA, "map": m.name, "preset": m.preset, "seeds": m.seeds,
        "shared_overrides": m.shared(), "cap_ms": CAP_MS, "arms": {k: list(v) for k, v in m.arms.items()},
        "cells": [c.as_dict() for c in m.cells], "runs": runs})


def read_plan(out: pathlib.Path) -> dict:
    """regime.json of ``out``; a missing file or unknown schema is one InputError line."""
    from testbed.analysis.formats import read_versioned

    return read_versioned(pathlib.Path(out) / "regime.json", PLAN_SCHEMA,
                          f"run `dblp-testbed regime NAME --out {out}` first",
                          "rerun the map with this version")


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
    if name not in MAPS:
        raise InputError(f"unknown regime map {name!r}; choose from {', '.join(MAPS)}")
    m = MAPS[name]
    m.select(tuple(cells))  # an unknown cell fails before anything runs
    if out is None:
        if report_only:
            raise InputError("--report-only needs --out DIR (the map's directory)")
        out = f"results/regime-{name}-{time.strftime('%Y%m%dT%H%M%S')}"
    out_dir = pathlib.Path(out)
    t0 = time.monotonic()
    plan = read_plan(out_dir) if report_only else execute(m, out_dir, tuple(cells))
    from testbed.analysis import regime as analysis

    doc = analysis.write(out_dir, plan)
    if not report_only:
        output.say(f"regime {name}: {time.monotonic() - t0:.0f} s")
    failed = sorted(n for n, r in plan["runs"].items() if r["status"] != "ok")
    results(doc, json_out, lambda: click.echo(analysis.text(doc)))
    if failed:
        raise ExperimentFailed(f"regime cell(s) {', '.join(failed)} did not finish "
                               f"(see {out_dir}/<cell>/manifest.json); rerun the same command "
                               "to retry only those")
