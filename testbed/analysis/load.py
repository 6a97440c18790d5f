"""`load_run`: a run directory's data as pandas DataFrames, for notebooks.

    from testbed.analysis import load_run
    run = load_run("results/default-20260101T000000Z")   # refuses versions it does not know
    run.rounds[run.rounds.in_burst].groupby("arm").latency_ms.median()
    run.packets.groupby(["arm", "kind"]).size()           # every captured packet
    run.bottleneck.plot(x="t_ns", y="tx_mbps")            # port counters, every 5 s
    run.queue.plot(x="t_ns", y="backlog_packets")         # the bottleneck queue, every 50 ms

    ref = load_run("results/reference/default")           # a committed reference, too
    ref.rounds, ref.evals, ref.summary["verdicts"]

Everything comes from the derived files (`dblp-testbed report DIR` rebuilds
them from raw/) and every file's version is checked first: the manifest,
summary.json and each table's Parquet metadata. A version this code does
not know is refused with one line (an InputError), never read by guessing.

A committed reference (`results/reference/NAME`) keeps less than a run
directory, to stay small in git: its summary, its spec and the CSV copies of
the rounds, bursts and evaluations, and no manifest (its `reproduce.json`
says how it was made). `load_run` reads it as such (`RunData.reference`):
the kept tables with their declared kinds, the others empty with their
declared columns, and an empty manifest.
The columns are those `testbed.analysis.datasets` declares (`TABLES[name]
.columns`, each with its kind and meaning).
"""
from __future__ import annotations

import dataclasses
import pathlib

import pandas as pd

from testbed.analysis import datasets
from testbed.analysis.formats import read_summary
from testbed.analysis.raw import load_spec
from testbed.config.spec import Spec
from testbed.rundir import read_manifest


@dataclasses.dataclass
class RunData:
    """One run directory's tables, summary, spec and manifest (see datasets for the columns)."""

    run_dir: pathlib.Path
    rounds: pd.DataFrame       # one row per arm x round
    bursts: pd.DataFrame       # one row per burst
    flows: pd.DataFrame        # packets per arm x round x flow, from the captures
    packets: pd.DataFrame      # every captured packet
    bottleneck: pd.DataFrame   # port counters of the server's downlink per sample
    queue: pd.DataFrame        # that port's queue occupancy per sample
    evals: pd.DataFrame        # test accuracy per evaluation
    summary: dict              # summary.json (testbed.analysis.formats)
    spec: Spec                 # the resolved spec.toml; spec["topology"]["bw_mbps"], ...
    manifest: dict             # manifest.json (testbed.rundir); {} for a committed reference
    reference: bool = False    # a committed reference: only rounds, bursts and evals are kept


def load_run(run_dir) -> RunData:
    """Read RUN_DIR's derived data, refusing any file of an unknown version (InputError)."""
    run_dir = pathlib.Path(run_dir)
    if _is_reference(run_dir):
        return _load_reference(run_dir)
    manifest = read_manifest(run_dir)
    tables = {name: datasets.read(run_dir, t) for name, t in datasets.TABLES.items()}
    return RunData(run_dir=run_dir, summary=read_summary(run_dir), spec=load_spec(run_dir),
                   manifest=manifest, **tables)


def _is_reference(run_dir: pathlib.Path) -> bool:
    """A committed reference: CSV tables kept, no manifest and no Parquet (module docstring)."""
    return (not (run_dir / "manifest.json").exists()
            and (run_dir / f"{datasets.ROUNDS.name}.csv").is_file()
            and not (run_dir / f"{datasets.ROUNDS.name}.parquet").exists())


def _load_reference(run_dir: pathlib.Path) -> RunData:
    """A committed reference's kept tables (CSV, declared kinds); the rest empty."""
    tables = {name: (datasets.read_csv(run_dir, t) if (run_dir / f"{name}.csv").is_file()
                     else datasets.conform(t, pd.DataFrame(columns=t.names())))
              for name, t in datasets.TABLES.items()}
    return RunData(run_dir=run_dir, summary=read_summary(run_dir), spec=load_spec(run_dir),
                   manifest={}, reference=True, **tables)
