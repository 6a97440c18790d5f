"""One experiment end to end: the run, which stops at raw/, then the analysis of raw/.

Why apart from the runner: the run measures and the analysis derives, and
they meet only in the run directory (`testbed.rundir`). The runner never
calls the analysis; this module chains the analysis after it with the very
call `dblp-testbed report DIR` makes (`testbed.analysis.pipeline.build_outputs`),
so `run` and `report` derive the same files the same way. `dblp-testbed run`,
`reproduce`, `ablate` and `regime` all run an experiment through here.

A failed analysis never costs the run: raw/ stays, the manifest records
why (``report_error``) and the status is the run's own. A failed run still
gets its partial outputs: the analysis runs on whatever raw/ holds, unless
no unit started (`refused`): then there is nothing to analyse.

The experiment ends with its answer on stdout (`testbed.analysis.answer`):
the verdict on each claim and pair, then the units that broke an emulator
invariant. An experiment whose arms all finished but which has such a unit
returns ``INVALID``: the manifest still says "ok" (every arm ran; validity
is the analysis's judgement, which `report` can make again under other
limits).
"""
from __future__ import annotations

import pathlib

import click

from testbed import output
from testbed.config.spec import Spec

#: The status of a run whose arms all finished but some unit broke an invariant.
INVALID = "invalid"


def run_and_report(spec: Spec, out: str | None, json_out: str | None = None) -> str:
    """Run ``spec`` into a fresh run directory, derive its outputs and print its answer
    (``json_out``: as one JSON object, `testbed.output.results`); the status: the run's
    own, or ``INVALID`` (see `finish`)."""
    from testbed.run import runner  # looked up at the call: tests replace run_experiment

    finished = runner.run_experiment(spec, out)
    if finished.status != "ok" and not any_unit_started(finished.run_dir):
        return refused(finished.status, finished.run_dir, json_out)
    return finish(finished.status, report_kept(finished.run_dir), finished.run_dir, json_out)


def any_unit_started(run_dir: pathlib.Path) -> bool:
    """Whether the manifest has a unit past "pending"/"skipped"; True when it cannot be read,
    so a doubt leads to the full analysis rather than to silence."""
    from testbed.rundir import ManifestError, read_manifest

    try:
        units = read_manifest(run_dir)["units"]
    except ManifestError:
        return True
    return any(u["status"] not in ("pending", "skipped") for u in units)


def refused(status: str, run_dir: pathlib.Path, json_out: str | None = None) -> str:
    """End a run that stopped before its first unit: no analysis, no verdict table.

    Why: analysed, an empty raw/ gave a table of "unresolved (no rounds)"
    rows and the plots' warnings around the one line that said why the run
    stopped (the runner's, e.g. a cluster server that cannot be reached).
    That line and the run directory were already said; only ``--json`` gets
    its object, so a script still reads one. The status is the run's own.
    """
    from testbed.analysis import answer

    output.results(answer.as_json(None, run_dir, status), json_out, lambda: None)
    return status


def finish(status: str, summary: dict | None, run_dir: pathlib.Path,
           json_out: str | None = None) -> str:
    """Print the run's answer (stdout) and its status line; the status, ``INVALID`` when
    every arm finished but some unit broke an invariant."""
    from testbed.analysis import answer

    bad = (summary or {}).get("invalid_units", [])
    final = INVALID if status == "ok" and bad else status

    def text():
        if summary is not None:
            for line in answer.lines(summary):
                click.echo(line)
    output.results(answer.as_json(summary, run_dir, final), json_out, text)
    if status == "ok" and bad:
        status = INVALID
        output.warn(f"run {status}: {len(bad)} unit(s) broke an emulator invariant; their "
                    f"figures decide nothing (exit 3): {run_dir}")
    elif status == "ok":
        output.say(f"run ok: every unit valid: {run_dir}")
    else:
        output.warn(f"run {status}: {run_dir}")
    return status


def report_kept(run_dir: pathlib.Path) -> dict | None:
    """Derive every output of ``run_dir`` from raw/; on failure, say why in its manifest
    (``report_error``) and return None instead of raising: the run is kept as it is."""
    from testbed.analysis.pipeline import build_outputs
    from testbed.rundir import Manifest

    try:
        return build_outputs(run_dir)
    except Exception as exc:  # noqa: BLE001 - recorded, the run is kept
        output.warn(f"dblp-testbed: report failed: {exc}")
        try:
            Manifest.of(run_dir).update(report_error=f"{type(exc).__name__}: {exc}")
        except Exception as why:  # noqa: BLE001 - an unreadable manifest was the failure
            output.warn(f"dblp-testbed: could not record it in the manifest: {why}")
        return None
