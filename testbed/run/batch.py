"""Many `run`s as one resumable job: what `ablate` and `regime` share.

Why one place: a sweep of runs is hours of emulation, and a machine that
reboots or a Ctrl-C halfway must not cost the runs that finished. A run
whose manifest says ``status = ok`` is not run again; a run that did not
finish keeps its directory (logs, partial tables), renamed
``NAME.failed-TIME``, before it is retried. Every spec is resolved before
the first run starts, so a bad point fails in a second, not after an hour.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from collections.abc import Callable

from testbed import output
from testbed.errors import ExperimentFailed
from testbed.run.experiment import INVALID

#: The status a run ends with when SIGINT or SIGTERM stopped it.
INTERRUPTED = "interrupted"


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of a batch: its directory name, its `--set` overrides and its resolved spec."""

    name: str
    overrides: tuple[str, ...]
    spec: object


def status(run_dir: pathlib.Path) -> str | None:
    """How a run directory's run ended, None if there is none: its manifest's status, or
    ``INVALID`` where the run finished but its summary lists invalid units. A study's
    resume runs again every run whose status is not "ok", so an invalid run is made
    again, as the study's error message promises."""
    try:
        st = json.loads((run_dir / "manifest.json").read_text()).get("status")
    except (OSError, ValueError):
        return None
    if st == "ok":
        try:
            bad = json.loads((run_dir / "summary.json").read_text()).get("invalid_units")
        except (OSError, ValueError):
            bad = None
        if bad:
            return INVALID
    return st


def run_pending(label: str, runs: list[PlannedRun], out: pathlib.Path,
                run_fn: Callable | None, record: Callable[[str, dict], None]) -> None:
    """Run every run of ``runs`` not yet done under ``out``, in order.

    ``run_fn(spec, out_dir) -> status`` runs one experiment (the run and its
    analysis, `testbed.run.experiment.run_and_report`; tests pass their own). ``record(name, {"status",
    "wall_s"})`` is called after each run, so the caller's plan file is
    current whenever the job is interrupted. A run stopped by SIGINT or
    SIGTERM stops the batch (ExperimentFailed): Ctrl-C means the whole job,
    not only the run it landed in.
    """
    if run_fn is None:
        from testbed.run.experiment import run_and_report as run_fn
    for i, r in enumerate(runs, 1):
        d = out / r.name
        before = status(d)
        if before == "ok":
            output.say(f"{label}: {r.name} done before ({i}/{len(runs)})")
            continue
        if d.exists() and any(d.iterdir()):
            kept = d.with_name(f"{r.name}.failed-{time.strftime('%Y%m%dT%H%M%S')}")
            d.rename(kept)
            why = "had a unit that broke an emulator invariant" if before == INVALID \
                else "had not finished"
            output.warn(f"{label}: {r.name} {why}; kept as {kept.name}")
        output.say(f"{label}: run {i}/{len(runs)}: {r.name} (--set {' --set '.join(r.overrides)})")
        t0 = time.monotonic()
        st = run_fn(r.spec, str(d))
        record(r.name, {"status": st, "wall_s": round(time.monotonic() - t0, 1)})
        if st == INTERRUPTED:
            raise ExperimentFailed(f"{label}: stopped in {r.name} ({d}); rerun the same "
                                   "command to resume from it")


def write_json(path: pathlib.Path, doc: dict) -> None:
    """Write ``doc`` atomically: a reader never sees half a plan."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
