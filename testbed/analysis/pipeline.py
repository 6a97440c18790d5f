"""The analysis as one pipeline, in one direction: raw files, tables, summary, outputs.

    raw = load_raw(run_dir)                 # every raw file, read and checked once (RawRun)
    bundle = tables(raw)                    # one bundle of every table (Tables)
    summary = summarize(bundle)             # summary.json's content, verdicts included
    write_outputs(run_dir, bundle, summary) # the tables' files, summary.json, plots/, report

Why a pipeline: each stage is a function of the one before and of nothing
else, so a reader follows the data one way: no stage opens a file an
earlier stage read, and none calls back into an earlier one.
`build_outputs` chains the four; `dblp-testbed report DIR` calls it, and so
does `dblp-testbed run` once the run has stopped at raw/
(`testbed.run.experiment`), so a run's outputs and a rebuilt run's are made
by the same call. It only reads raw/, spec.toml and manifest.json and only
writes derived files, and it is deterministic: rebuilding a run directory
gives byte-identical outputs, so "every number recomputes from raw/" is
something a test can check.
"""
from __future__ import annotations

import dataclasses
import pathlib

import click
import pandas as pd

from testbed import output
from testbed import physics as phys
from testbed.analysis import bottleneck as bn
from testbed.analysis import claims, datasets, report
from testbed.analysis import summary as sm
from testbed.analysis import tables as tb
from testbed.analysis.formats import write_summary
from testbed.analysis.raw import RawRun, load_raw

#: Every file `write_outputs` writes into the run directory.
DERIVED = datasets.files() + ["summary.json", "report.md", "report.html", "plots"]
# Derived files earlier versions wrote that no longer mean what their name
# says (packets.csv held per-round flow counts, now flows.csv): a rebuild
# removes them rather than leave a stale file beside packets.parquet.
RETIRED = ["packets.csv"]

__all__ = ["DERIVED", "RawRun", "Tables", "build_outputs", "load_raw", "summarize", "tables",
           "write_outputs"]


@dataclasses.dataclass(frozen=True)
class Tables:
    """The second stage's one bundle: every table of a run and what they were built from.

    The columns of each table are `testbed.analysis.datasets`'s declaration.
    """

    raw: RawRun
    inputs: phys.PhysicsInputs | None   # the physical bound's inputs (None: some missing)
    physics_missing: list[str]          # which inputs were missing
    rounds: pd.DataFrame                # one row per arm x seed x round
    bursts: pd.DataFrame                # one row per burst
    flows: pd.DataFrame                 # packets per arm x round x flow, from the captures
    packets: pd.DataFrame               # every captured packet
    bottleneck: pd.DataFrame            # the bottleneck port's counters per sample
    queue: pd.DataFrame                 # its queue occupancy per sample
    evals: pd.DataFrame                 # test accuracy per evaluation
    notes: list[str]                    # what reading the captures and counters had to say

    def files(self) -> tuple[tuple[datasets.Table, pd.DataFrame], ...]:
        """Each table with its declaration, in the order they are written."""
        return ((datasets.ROUNDS, self.rounds), (datasets.BURSTS, self.bursts),
                (datasets.FLOWS, self.flows), (datasets.PACKETS, self.packets),
                (datasets.BOTTLENECK, self.bottleneck), (datasets.QUEUE, self.queue),
                (datasets.EVALS, self.evals))


def tables(raw: RawRun, physics: dict | phys.PhysicsInputs | None = None,
           port: int | None = None) -> Tables:
    """Every table of the run, built from ``raw`` alone (the captures are read here).

    physics: optional PhysicsInputs (or a dict of its fields) overriding what
    the spec and manifest say (see physics.inputs_for_run). port: the DBLP UDP
    port in the pcaps (default: manifest `dblp_port`, else the transport's).
    A capture that cannot be read costs only its own packets (a note names it).
    """
    from testbed.analysis import packets as pkts  # scapy: only when reading captures

    if isinstance(physics, phys.PhysicsInputs):
        inputs, missing = physics, []
    else:
        inputs, missing = phys.inputs_for_run(raw.spec, raw.manifest, raw.grad_bytes, physics)
    # Each builder once, in the order the data needs: the logs' tables, the captures
    # (which need the rounds and add the bursts' received packets), the joins of
    # rounds and bursts and the bounds, then the bottleneck's counters and queue.
    rounds = tb.rounds_table(raw)
    bursts = tb.bursts_table(raw)
    evals = tb.evals_table(raw, rounds)
    flows, packets, addrs, notes = pkts.packet_table(
        raw.run_dir, raw.arms, rounds, port or raw.manifest.get("dblp_port") or pkts.DEFAULT_PORT)
    bursts = pkts.burst_receptions(packets, bursts, addrs)
    rounds, bursts = tb.join(rounds, bursts, inputs)
    link = bn.bottleneck_table(raw.run_dir, raw.spec, raw.manifest, notes)
    queue = bn.queue_table(raw.queue, bursts)
    return Tables(raw, inputs, missing, rounds, bursts, flows, packets, link, queue, evals, notes)


def summarize(t: Tables) -> dict:
    """The whole summary.json (declared in testbed.analysis.formats): the tables' figures
    (`testbed.analysis.summary.summarize`), then the claims' intervals and verdicts."""
    summary = sm.summarize(t)
    return claims.with_verdicts(summary, t.raw.spec, t.rounds, tb.valid_rows(t.evals),
                                tb.invalid_units(t.raw), bursts=t.bursts)


def write_outputs(run_dir, t: Tables, summary: dict, figures: bool = True) -> None:
    """summary.json first (so a failing table or plot never costs it), then every table's
    files, then plots/ and report.md/html (figures=False skips those two)."""
    run_dir = pathlib.Path(run_dir)
    write_summary(run_dir / "summary.json", summary)
    for name in RETIRED:
        (run_dir / name).unlink(missing_ok=True)
    for table, df in t.files():
        datasets.write(run_dir, table, df)
    if figures:
        report.write(run_dir, summary, t)


def build_outputs(run_dir, physics: dict | phys.PhysicsInputs | None = None,
                  port: int | None = None, figures: bool = True) -> dict:
    """Rebuild every derived file of ``run_dir`` (`DERIVED`) from raw/; return the summary.

    The four stages, chained. physics and port: see `tables`. figures=False
    skips plots/ and report.md/html (a second per call saved for callers
    that only need the numbers, e.g. tests).
    """
    raw = load_raw(run_dir)
    bundle = tables(raw, physics, port)
    summary = summarize(bundle)
    write_outputs(run_dir, bundle, summary, figures)
    return summary


@click.command("report")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--rtt-ms", type=float, default=None,
              help="Measured worker-server RTT for the physical bound (default: manifest.json).")
@click.option("--rate-mbps", type=float, default=None,
              help="Bottleneck rate for the physical bound (default: spec topology.bw_mbps).")
@output.json_option
def report_cmd(run_dir, rtt_ms, rate_mbps, json_out):
    """Rebuild every derived file of RUN_DIR from raw/ (+ spec.toml, manifest.json).

    Ends with the run's answer, as `run` does: the verdict on each claim and
    pair, then the invalid units (those that broke an emulator invariant).
    """
    from testbed.analysis import answer

    override = {}
    if rtt_ms is not None:
        override["rtt_s"] = rtt_ms / 1000.0
    if rate_mbps is not None:
        override["rate_bps"] = rate_mbps * 1e6
    s = build_outputs(run_dir, override or None)

    def text():
        click.echo(f"{run_dir}: status {s['status']}; wrote " + ", ".join(DERIVED))
        for line in report.summary_lines(s):
            click.echo(line)
        # The answer last, as `run` ends: what a reader looks at first.
        for line in answer.lines(s):
            click.echo(line)
    output.results(answer.as_json(s, run_dir, s["status"]), json_out, text)
