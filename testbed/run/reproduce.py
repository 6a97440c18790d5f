"""`dblp-testbed reproduce`: everything behind the measured tables, from scratch.

The references themselves (what each is, its commands, its record) are
declared in `testbed.references`; this module makes them: one `Maker` per
kind of reference (`MAKERS`, by class) runs it in a fresh run directory,
says which of its files the repository keeps and, for a run, draws its
figures from them (`testbed.analysis.reference_figures`, again on
``--readme-only`` and ``--rejudge``). The files are committed: the
tables of the README and of every page under docs/ (`pages`: one page per
reference under docs/results/) are rendered from them
(`testbed.analysis.pages`), and a unit test fails when a page and the
files disagree, so a table on a page is always the table of a run anyone
can inspect and re-run.

A reference that fails still leaves its run directory (logs, partial
outputs); its reference folder is left as it was, the others still run,
and the command exits 1 at the end.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import click

from testbed import REPO_ROOT, output, references
from testbed.errors import ExperimentFailed, TestbedError
from testbed.output import json_option, results
from testbed.references import (
    EVERY,
    KEPT_FILES,
    RECORD,
    RECORD_SCHEMA,
    REFERENCE_DIR,
    AblationReference,
    CommandReference,
    Reference,
    RegimeReference,
    RunReference,
    StudyReference,
    pages,
    select,
)
from testbed.run.ablation import Ablation
from testbed.run.regime import RegimeMap
from testbed.run.study import Study


def run_cli(argv: list[str], log: pathlib.Path) -> int:
    """Run ``dblp-testbed ARGV`` as a child process, its output into ``log``; its exit code.

    A child, not a call: the fabric commands install signal handlers and end
    with `sys.exit`, and each should start from a fresh interpreter as a
    user's command does (net check's start-up time includes it).

    Interrupted (Ctrl-C, or SIGINT to this process), it passes one SIGINT on
    and waits for the child to tear down what it made (a bench's namespaces,
    a fabric) before it gives up: ``subprocess.call`` would SIGKILL the child
    at once and leave them behind. The child has a session of its own, so a
    terminal's Ctrl-C reaches it only this way, once: a second SIGINT would
    cut its tear-down short.
    """
    with open(log, "w") as f:
        child = subprocess.Popen([sys.executable, "-m", "testbed.cli", *argv], stdout=f,
                                 stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True)
        try:
            return child.wait()
        except BaseException:
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=CHILD_TEARDOWN_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise


def _rejudge_run(ref_dir: pathlib.Path) -> None:
    from testbed.analysis import claims  # pandas: only when asked (tests/unit/test_cli_lazy.py)
    claims.rejudge(ref_dir)


def _rejudge_ablation(ref_dir: pathlib.Path) -> None:
    from testbed.analysis import ablation
    ablation.rejudge(ref_dir)


#: How each kind of reference is judged again from the files it keeps (`rejudge_references`). Not
#: here: commands (benches and net checks judge no claim) and the regime map (one seed,
#: its only intervals pool burst rounds: they need its runs' rounds, which it does not
#: keep, and the estimators of rounds have not changed).
REJUDGERS: dict[type[Reference], Callable[[pathlib.Path], None]] = {
    RunReference: _rejudge_run,
    AblationReference: _rejudge_ablation,
}


def rejudge_references(refs: list[Reference], reference_dir: pathlib.Path = REFERENCE_DIR) -> list[str]:
    """Judge the claims of ``refs`` again from their committed files, with today's intervals
    (a run: every interval and verdict, from its rounds and evaluations; an ablation: its
    accuracy differences, from the per-seed final accuracies it keeps). Runs nothing; a
    reference without a folder is skipped. Returns the names rejudged."""
    done = []
    for ref in refs:
        fn = REJUDGERS.get(type(ref))
        if fn is not None and (reference_dir / ref.name).is_dir():
            fn(reference_dir / ref.name)
            done.append(ref.name)
    return done


#: How long an interrupted child may take to tear down before it is killed (a fabric's
#: stop takes seconds; a bench's namespaces less).
CHILD_TEARDOWN_S = 60


def _make_run(ref: RunReference, out: pathlib.Path) -> tuple[str, dict]:
    from testbed.config import spec as specmod
    from testbed.config.presets import PRESETS
    from testbed.run.experiment import run_and_report

    output.say(f"reproduce {ref.name}: dblp-testbed {' '.join(ref.argv(out))}")
    path = str(REPO_ROOT / ref.spec_file) if ref.spec_file else None
    spec = specmod.load(path, PRESETS[ref.preset], list(ref.overrides))
    return run_and_report(spec, str(out)), {"argv": ref.argv(pathlib.Path("DIR"))}


def _make_commands(ref: CommandReference, out: pathlib.Path) -> tuple[str, dict]:
    out.mkdir(parents=True, exist_ok=True)
    runner = ref.runner or run_cli
    done, failed = [], []
    for c in ref.steps:
        argv = c.full_argv(str(out / c.file))
        log = out / (c.file.removesuffix(".json") + ".log")
        output.say(f"reproduce {ref.name}: dblp-testbed {' '.join(c.full_argv(c.file))}")
        t0 = time.monotonic()
        code = runner(argv, log)
        wall = round(time.monotonic() - t0, 1)
        if code != 0 or not (out / c.file).is_file():
            failed.append(f"{' '.join(c.argv)} exited {code} (log: {log})")
        done.append({"file": c.file, "argv": c.full_argv(c.file), "wall_s": wall})
    return ("ok" if not failed else "; ".join(failed)), {"commands": done}


#: The kind of study each study reference runs (`testbed.run.study.Study` subclasses).
STUDIES: dict[type[StudyReference], type[Study]] = {
    AblationReference: Ablation,
    RegimeReference: RegimeMap,
}


def declared(ref: StudyReference) -> Study:
    """The declared study a study reference names."""
    return STUDIES[type(ref)].registry[ref.study]


def _make_study(ref: StudyReference, out: pathlib.Path) -> tuple[str, dict]:
    study = declared(ref)
    output.say(f"reproduce {ref.name}: dblp-testbed {study.command} {ref.study} --out {out}")
    plan = study.execute(out, run_fn=ref.run_fn)
    study.write_outputs(out, plan)
    failed = study.failed(plan)
    return ("ok" if not failed else f"{study.part_noun}s {', '.join(failed)} did not finish",
            {"argv": ref.commands()[0]})


def _draw_run(ref_dir: pathlib.Path) -> list[str]:
    from testbed.analysis import reference_figures  # matplotlib: only when drawing
    return [p.name for p in reference_figures.draw(ref_dir)]


@dataclasses.dataclass(frozen=True)
class Maker:
    """How one kind of reference is made: ``make(ref, out) -> (status, record)`` produces
    its files in ``out`` (the status "ok" or why not; the record for reproduce.json
    besides the wall time), ``files(ref)`` names those the repository keeps, and
    ``draw(ref_dir)``, where the kind has figures drawn from its kept files, draws them
    beside those files (the names it wrote)."""

    make: Callable
    files: Callable[..., tuple[str, ...]]
    draw: Callable[[pathlib.Path], list[str]] | None = None


MAKERS: dict[type[Reference], Maker] = {
    RunReference: Maker(_make_run, lambda ref: KEPT_FILES, _draw_run),
    CommandReference: Maker(_make_commands, CommandReference.files),
    AblationReference: Maker(_make_study, lambda ref: declared(ref).kept_files()),
    RegimeReference: Maker(_make_study, lambda ref: declared(ref).kept_files()),
}


def produce(ref: Reference, out: pathlib.Path) -> tuple[str, dict]:
    """Make ``ref``'s files in ``out``; its status ("ok" or why not) and its record."""
    return MAKERS[type(ref)].make(ref, out)


def kept_files(ref: Reference) -> tuple[str, ...]:
    """The files of ``ref``'s run directory that results/reference/ keeps."""
    return MAKERS[type(ref)].files(ref)


def draw_figures(refs: list[Reference], reference_dir: pathlib.Path = REFERENCE_DIR) -> list[str]:
    """Draw the figures of ``refs`` again from their committed files (a run reference's:
    `testbed.analysis.reference_figures`). Runs nothing; a reference without a folder, or of
    a kind without such figures, is skipped. Returns the names drawn."""
    done = []
    for ref in refs:
        fn = MAKERS[type(ref)].draw
        if fn is not None and (reference_dir / ref.name / RECORD).is_file():
            fn(reference_dir / ref.name)
            done.append(ref.name)
    return done


def keep(run_dir: pathlib.Path, dest: pathlib.Path, files: tuple[str, ...] = KEPT_FILES,
         record: dict | None = None) -> list[str]:
    """Copy ``files`` of a finished run (and ``record`` as reproduce.json) into ``dest``, replacing it."""
    missing = [f for f in files if not (run_dir / f).is_file()]
    if missing:
        raise ExperimentFailed(f"{run_dir} lacks {', '.join(missing)}; its reference "
                               f"{dest.name} was left unchanged")
    tmp = dest.with_name(dest.name + ".new")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in files:
        (tmp / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(run_dir / f, tmp / f)
    if record is not None:
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return list(files)


def reproduce(refs: list[Reference], runs_root: pathlib.Path,
              reference_dir: pathlib.Path = REFERENCE_DIR) -> dict:
    """Produce each reference, keep its files, and return what happened (wall times included).

    A reference that fails (its status, or a `TestbedError` on the way)
    leaves its run directory and its reference folder as they were; the
    next one still runs.
    """
    stamp = time.strftime("%Y%m%dT%H%M%S")
    done: dict[str, dict] = {}
    for ref in refs:
        out = runs_root / f"{ref.name}-{stamp}"
        t0 = time.monotonic()
        try:
            status, record = produce(ref, out)
        except TestbedError as exc:
            status, record = str(exc), {}
        wall = round(time.monotonic() - t0, 1)
        if status == "ok":
            rec = {"schema": RECORD_SCHEMA, "kind": ref.kind, **record, "wall_s": wall}
            try:
                keep(out, reference_dir / ref.name, kept_files(ref), rec)
            except TestbedError as exc:
                status = str(exc)
            else:
                # The figures its page shows, from the files it keeps.
                draw_figures([ref], reference_dir)
        done[ref.name] = {"run_dir": str(out), "status": status, "wall_s": wall}
        output.say(f"reproduce {ref.name}: {status} in {wall / 60:.1f} min")
    return done


def update_readme(reference_dir: pathlib.Path = REFERENCE_DIR,
                  targets: list[pathlib.Path] | None = None,
                  only: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """Re-render the marked tables of ``only`` (default: every reference) on every page.

    ``targets``: the pages to render (default `pages()`: the README and docs/).
    A reference without a committed folder yet keeps its blocks as they are
    (the tables test still fails on them), and so do the blocks of every
    reference (`EVERY`) until all have one. Returns the changed blocks (each
    once, whichever pages show it) and the references left without data.
    """
    from testbed.analysis import pages as rd

    names = tuple(only) or tuple(references.REFERENCES)
    ready = tuple(n for n in names if (reference_dir / n / RECORD).is_file())
    if all((reference_dir / n / RECORD).is_file() for n in references.REFERENCES):
        ready += (EVERY,)
    missing = [n for n in names if n not in ready]
    if not ready:
        return [], missing
    changed: list[str] = []
    for page in pages() if targets is None else targets:
        text = page.read_text()
        stale = rd.stale(text, reference_dir, ready)
        if stale:
            page.write_text(rd.update(text, reference_dir, ready))
        changed += [block for block in stale if block not in changed]
    return changed, missing


@click.command("reproduce")
@click.argument("names", nargs=-1)
@click.option("--runs", "runs_root", type=click.Path(file_okay=False), default="results/reproduce",
              show_default=True, help="Where the run directories go (each kept in full).")
@click.option("--readme-only", is_flag=True,
              help="Run nothing: draw the run references' figures again from the files they "
                   "keep and re-render the tables of the README and docs/ from "
                   "results/reference/.")
@click.option("--rejudge", is_flag=True,
              help="Run nothing: judge the claims of the committed references again from the "
                   "files they keep (today's intervals), rewrite their summaries, then draw the "
                   "figures and re-render the tables.")
@json_option
def reproduce_cmd(names, runs_root, readme_only, rejudge, json_out):
    """Regenerate the measured tables from scratch: every reference (or NAMES).

    A reference is a preset run or a set of other commands (benches, net
    checks); its small output files replace results/reference/NAME/
    (commit them), a run's figures are drawn from them as SVG beside them;
    then the marked tables of the README and of docs/ (one page per
    reference under docs/results/; of NAMES, if given, and the table of
    every reference's wall time) are re-rendered from them.
    """
    refs = select(names)
    done = {} if readme_only or rejudge else reproduce(refs, pathlib.Path(runs_root))
    rejudged = rejudge_references(refs) if rejudge else []
    # A fresh reference drew its figures when it was kept (`reproduce`).
    drawn = draw_figures(refs) if readme_only or rejudge else []
    changed, no_data = update_readme(only=tuple(names))
    failed = [n for n, e in done.items() if e["status"] != "ok"]
    doc = {"runs": done, "rejudged": rejudged, "figures_drawn": drawn,
           "readme_tables_changed": changed, "failed": failed,
           "references_without_data": no_data}

    def text():
        for n, e in done.items():
            click.echo(f"{n}: {e['status']} in {e['wall_s'] / 60:.1f} min ({e['run_dir']})")
        if rejudge:
            click.echo(f"judged again from their files: {', '.join(rejudged) or 'none'}")
        if drawn:
            click.echo(f"figures drawn from their files: {', '.join(drawn)}")
        click.echo(f"tables re-rendered: {', '.join(changed) or 'none changed'}")
        if no_data:
            click.echo(f"no committed data yet (their blocks left as they are): "
                       f"{', '.join(no_data)}")

    results(doc, json_out, text)
    if failed:
        raise ExperimentFailed(f"reference run(s) {', '.join(failed)} failed; their "
                               "results/reference/ folders were left unchanged")
