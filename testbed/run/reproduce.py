"""`dblp-testbed reproduce`: every run behind the README's result tables, from scratch.

Each `Reference` names a preset, its seeds and overrides, and the folder of
``results/reference/`` that keeps the run's small derived files (summary,
per-round and per-burst tables, evaluations, the resolved spec). Those files
are committed: the README's result tables are rendered from them
(`testbed.analysis.readme`), and a unit test fails when the README and the
files disagree, so a table in the README is always the table of a run
anyone can inspect and re-run.

A reference run that fails still leaves its run directory (logs, partial
tables); its reference folder is left as it was, and the command exits 1
after trying the others.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import time

import click

from testbed import REPO_ROOT, output
from testbed.errors import ExperimentFailed, InputError
from testbed.output import json_option, results

#: Where the committed reference data live.
REFERENCE_DIR = REPO_ROOT / "results" / "reference"
#: The derived files kept per reference run: small, and enough to rebuild
#: every README table and to check each figure by hand.
KEPT_FILES = ("summary.json", "rounds.csv", "bursts.csv", "evals.csv", "spec.toml")


@dataclasses.dataclass(frozen=True)
class Reference:
    """One run whose tables the README shows."""

    name: str
    preset: str
    doc: str
    overrides: tuple[str, ...] = ()

    def argv(self, out: pathlib.Path) -> list[str]:
        """The `dblp-testbed run` arguments that regenerate it (also shown in the README)."""
        args = ["run", "--preset", self.preset, "--out", str(out)]
        for o in self.overrides:
            args += ["--set", o]
        return args


REFERENCES: dict[str, Reference] = {}


def register(ref: Reference) -> Reference:
    if ref.name in REFERENCES and REFERENCES[ref.name] != ref:
        raise ValueError(f"reference {ref.name!r} is already registered")
    REFERENCES[ref.name] = ref
    return ref


register(Reference("default", "default",
                   "what `dblp-testbed run` does with no argument: the like-for-like arms, "
                   "seeds and bursts of the default preset"))
register(Reference("paper", "paper",
                   "the paper's star with the parameter server, both control paths, "
                   "five bursts at each of 60/70/80/90 %"))
register(Reference("star", "star",
                   "the accuracy check: the paper's star without bursts, every transport arm, "
                   "400 rounds with the rate annealed, two seeds"))


def select(names: tuple[str, ...] | list[str]) -> list[Reference]:
    """The references called ``names`` (all when empty); an unknown name is an InputError."""
    if not names:
        return list(REFERENCES.values())
    unknown = [n for n in names if n not in REFERENCES]
    if unknown:
        raise InputError(f"unknown reference {unknown[0]!r}; choose from {', '.join(REFERENCES)}")
    return [REFERENCES[n] for n in names]


def keep(run_dir: pathlib.Path, dest: pathlib.Path) -> list[str]:
    """Copy the kept files of a finished run into ``dest``, replacing what was there."""
    missing = [f for f in KEPT_FILES if not (run_dir / f).is_file()]
    if missing:
        raise ExperimentFailed(f"{run_dir} lacks {', '.join(missing)}; its reference "
                               f"{dest.name} was left unchanged")
    tmp = dest.with_name(dest.name + ".new")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in KEPT_FILES:
        shutil.copy2(run_dir / f, tmp / f)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return list(KEPT_FILES)


def reproduce(refs: list[Reference], runs_root: pathlib.Path,
              reference_dir: pathlib.Path = REFERENCE_DIR) -> dict:
    """Run each reference, keep its files, and return what happened (wall times included)."""
    from testbed.config import spec as specmod
    from testbed.config.presets import PRESETS
    from testbed.run.runner import run_experiment

    stamp = time.strftime("%Y%m%dT%H%M%S")
    done: dict[str, dict] = {}
    for ref in refs:
        out = runs_root / f"{ref.name}-{stamp}"
        output.say(f"reproduce {ref.name}: dblp-testbed {' '.join(ref.argv(out))}")
        spec = specmod.load(None, PRESETS[ref.preset], list(ref.overrides))
        t0 = time.monotonic()
        status = run_experiment(spec, str(out))
        wall = round(time.monotonic() - t0, 1)
        entry = {"run_dir": str(out), "status": status, "wall_s": wall}
        if status == "ok":
            keep(out, reference_dir / ref.name)
            (reference_dir / ref.name / "reproduce.json").write_text(
                json.dumps({"argv": ref.argv(pathlib.Path("DIR")), "wall_s": wall}, indent=2) + "\n")
        done[ref.name] = entry
        output.say(f"reproduce {ref.name}: {status} in {wall / 60:.1f} min")
    return done


def update_readme(reference_dir: pathlib.Path = REFERENCE_DIR,
                  readme: pathlib.Path = REPO_ROOT / "README.md",
                  only: tuple[str, ...] = ()) -> list[str]:
    """Rewrite the README's marked result tables (of ``only``, if given); return the changed ones."""
    from testbed.analysis import readme as rd

    text = readme.read_text()
    changed = rd.stale(text, reference_dir, only)
    if changed:
        readme.write_text(rd.update(text, reference_dir, only))
    return changed


@click.command("reproduce")
@click.argument("names", nargs=-1)
@click.option("--runs", "runs_root", type=click.Path(file_okay=False), default="results/reproduce",
              show_default=True, help="Where the run directories go (each kept in full).")
@click.option("--readme-only", is_flag=True,
              help="Run nothing: re-render the README's tables from results/reference/.")
@json_option
def reproduce_cmd(names, runs_root, readme_only, json_out):
    """Regenerate the README's result tables from scratch: every reference run (or NAMES).

    Each run's small derived files replace results/reference/NAME/ (commit
    them); then the README's marked tables (of NAMES, if given) are
    re-rendered from them.
    """
    refs = select(names)
    done = {} if readme_only else reproduce(refs, pathlib.Path(runs_root))
    changed = update_readme(only=tuple(names))
    failed = [n for n, e in done.items() if e["status"] != "ok"]
    doc = {"runs": done, "readme_tables_changed": changed, "failed": failed}

    def text():
        for n, e in done.items():
            click.echo(f"{n}: {e['status']} in {e['wall_s'] / 60:.1f} min ({e['run_dir']})")
        click.echo(f"README tables re-rendered: {', '.join(changed) or 'none changed'}")

    results(doc, json_out, text)
    if failed:
        raise ExperimentFailed(f"reference run(s) {', '.join(failed)} failed; their "
                               "results/reference/ folders were left unchanged")
