"""`dblp-testbed reproduce`: everything behind the measured tables, from scratch.

Each `Reference` regenerates some tables (its page, docs/results/NAME.md, and
the README's headline) and names the
folder of ``results/reference/`` that keeps the small files they are
rendered from. Three kinds, registered by class as the topologies are
(`REFERENCES` holds instances of the subclasses):

- `RunReference`: a `dblp-testbed run` of a preset (seeds, overrides); it
  keeps the run's derived tables (`KEPT_FILES`: summary, per-round and
  per-burst tables, evaluations, the resolved spec).
- `CommandReference`: one or more other `dblp-testbed` commands (a bench,
  a `net check` per fabric size or rate), each run with ``--json FILE``;
  it keeps those JSON files, each named after the command that wrote it.
- `StudyReference`: a declared study (`testbed.run.study`) run whole, of
  one of two kinds: `AblationReference`, a `dblp-testbed ablate`
  (`testbed.run.ablation`: one arm's setting varied over runs; it keeps the
  ablation's summary, per-point table, report and plots, not the runs' own
  tables), and `RegimeReference`, a `dblp-testbed regime` map
  (`testbed.run.regime`: the map's summary, tables, report and heat-maps).

Beside the kept files, ``reproduce.json`` (`RECORD_SCHEMA`) holds the
commands and their wall times. The files are committed: the tables of
the README and of every page under docs/ (`pages`: one page per reference
under docs/results/) are rendered from them (`testbed.analysis.readme`),
and a unit test fails when a page and the files disagree, so a table on a
page is always the table of a run anyone can inspect and re-run.

A reference that fails still leaves its run directory (logs, partial
outputs); its reference folder is left as it was, the others still run,
and the command exits 1 at the end.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import ClassVar

import click

from testbed import REPO_ROOT, output
from testbed.errors import ExperimentFailed, InputError, TestbedError
from testbed.output import json_option, results
from testbed.run.ablation import Ablation
from testbed.run.regime import RegimeMap
from testbed.run.study import Study

#: Where the committed reference data live.
REFERENCE_DIR = REPO_ROOT / "results" / "reference"
#: Where the pages of measured tables live: one page per reference (``NAME.md``).
RESULTS_PAGES = REPO_ROOT / "docs" / "results"


def pages(root: pathlib.Path = REPO_ROOT) -> list[pathlib.Path]:
    """The pages whose marked tables `reproduce` renders: the README and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]

#: The derived files kept per reference run: small, and enough to rebuild
#: every table of its page and to check each figure by hand.
KEPT_FILES = ("summary.json", "rounds.csv", "bursts.csv", "evals.csv", "spec.toml")
#: The file beside the kept ones that says how they were made.
RECORD = "reproduce.json"
#: Version of ``reproduce.json``: ``kind`` ("run" | "commands" | "ablation" | "regime"),
#: ``wall_s`` (the whole reference), and for a run or an ablation ``argv`` (the `dblp-testbed`
#: arguments, the run directory as DIR), for commands ``commands`` (one
#: ``{"file", "argv", "wall_s"}`` per command, ``--json`` naming the kept
#: file). Files written before the version existed (a run's ``argv`` and
#: ``wall_s`` only) read as version 1.
RECORD_SCHEMA = 1


class Reference:
    """What regenerates some measured tables, and the files of it the repository keeps.

    A subclass sets ``kind``, says which files it keeps (`kept_files`) and
    produces them in a fresh run directory (`produce`), returning what
    reproduce.json records besides the wall time.
    """

    kind: ClassVar[str]
    name: str
    doc: str

    def kept_files(self) -> tuple[str, ...]:
        raise NotImplementedError

    def commands(self) -> list[list[str]]:
        """The `dblp-testbed` argument lists that regenerate it (output paths as placeholders)."""
        raise NotImplementedError

    def produce(self, out: pathlib.Path) -> tuple[str, dict]:
        """Make the kept files in ``out``; return the status ("ok" or why not) and the record."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class RunReference(Reference):
    """A `dblp-testbed run` of a preset whose tables a results page shows."""

    kind: ClassVar[str] = "run"
    name: str
    preset: str
    doc: str
    overrides: tuple[str, ...] = ()

    def argv(self, out: pathlib.Path) -> list[str]:
        """The `dblp-testbed run` arguments that regenerate it (also shown on the results pages)."""
        args = ["run", "--preset", self.preset, "--out", str(out)]
        for o in self.overrides:
            args += ["--set", o]
        return args

    def kept_files(self) -> tuple[str, ...]:
        return KEPT_FILES

    def commands(self) -> list[list[str]]:
        return [self.argv(pathlib.Path("DIR"))]

    def produce(self, out: pathlib.Path) -> tuple[str, dict]:
        from testbed.config import spec as specmod
        from testbed.config.presets import PRESETS
        from testbed.run.runner import run_experiment

        output.say(f"reproduce {self.name}: dblp-testbed {' '.join(self.argv(out))}")
        spec = specmod.load(None, PRESETS[self.preset], list(self.overrides))
        return run_experiment(spec, str(out)), {"argv": self.argv(pathlib.Path("DIR"))}


def run_cli(argv: list[str], log: pathlib.Path) -> int:
    """Run ``dblp-testbed ARGV`` as a child process, its output into ``log``; its exit code.

    A child, not a call: the fabric commands install signal handlers and end
    with `sys.exit`, and each should start from a fresh interpreter as a
    user's command does (net check's start-up time includes it).
    """
    with open(log, "w") as f:
        return subprocess.call([sys.executable, "-m", "testbed.cli", *argv], stdout=f,
                               stderr=subprocess.STDOUT, cwd=REPO_ROOT)


@dataclasses.dataclass(frozen=True)
class Command:
    """One `dblp-testbed` command of a `CommandReference` and the JSON file it writes."""

    file: str
    argv: tuple[str, ...]

    def full_argv(self, json_path: str) -> list[str]:
        return [*self.argv, "--json", json_path]


@dataclasses.dataclass(frozen=True)
class CommandReference(Reference):
    """`dblp-testbed` commands run with ``--json FILE``, each file kept.

    ``runner(argv, log) -> exit code`` runs one command (`run_cli`; tests
    pass a fake). A command that exits non-zero or writes no JSON fails the
    reference; the files the others wrote stay in the run directory.
    """

    kind: ClassVar[str] = "commands"
    name: str
    doc: str
    steps: tuple[Command, ...]
    runner: Callable[[list[str], pathlib.Path], int] = dataclasses.field(
        default=run_cli, compare=False, repr=False)

    def __post_init__(self):
        files = [c.file for c in self.steps]
        if not files or len(set(files)) != len(files) or RECORD in files \
                or any(not f.endswith(".json") or "/" in f for f in files):
            raise ValueError(f"reference {self.name}: each command needs its own FILE.json")

    def kept_files(self) -> tuple[str, ...]:
        return tuple(c.file for c in self.steps)

    def commands(self) -> list[list[str]]:
        return [c.full_argv(c.file) for c in self.steps]

    def produce(self, out: pathlib.Path) -> tuple[str, dict]:
        out.mkdir(parents=True, exist_ok=True)
        done, failed = [], []
        for c in self.steps:
            argv = c.full_argv(str(out / c.file))
            log = out / (c.file.removesuffix(".json") + ".log")
            output.say(f"reproduce {self.name}: dblp-testbed {' '.join(c.full_argv(c.file))}")
            t0 = time.monotonic()
            code = self.runner(argv, log)
            wall = round(time.monotonic() - t0, 1)
            if code != 0 or not (out / c.file).is_file():
                failed.append(f"{' '.join(c.argv)} exited {code} (log: {log})")
            done.append({"file": c.file, "argv": c.full_argv(c.file), "wall_s": wall})
        return ("ok" if not failed else "; ".join(failed)), {"commands": done}


@dataclasses.dataclass(frozen=True)
class StudyReference(Reference):
    """A declared study (`testbed.run.study.Study`) run whole: the files its kind keeps.

    A subclass names the kind of study (``study_kind``); the reference's
    ``study`` is a study of that kind by name.
    """

    study_kind: ClassVar[type[Study]]
    name: str
    study: str
    doc: str
    #: ``run_fn(spec, out_dir) -> status`` for each run (None: the runner's; tests pass a fake).
    run_fn: Callable | None = dataclasses.field(default=None, compare=False, repr=False)

    def declared(self):
        return self.study_kind.registry[self.study]

    def kept_files(self) -> tuple[str, ...]:
        return self.declared().kept_files()

    def commands(self) -> list[list[str]]:
        return [[self.study_kind.command, self.study, "--out", "DIR"]]

    def produce(self, out: pathlib.Path) -> tuple[str, dict]:
        study = self.declared()
        output.say(f"reproduce {self.name}: dblp-testbed {study.command} {self.study} --out {out}")
        plan = study.execute(out, run_fn=self.run_fn)
        study.write_outputs(out, plan)
        failed = study.failed(plan)
        return ("ok" if not failed else f"{study.part_noun}s {', '.join(failed)} did not finish",
                {"argv": self.commands()[0]})


@dataclasses.dataclass(frozen=True)
class AblationReference(StudyReference):
    """A `dblp-testbed ablate` of a declared ablation: its summary, table, report and plots."""

    kind: ClassVar[str] = "ablation"
    study_kind: ClassVar[type[Study]] = Ablation


@dataclasses.dataclass(frozen=True)
class RegimeReference(StudyReference):
    """A `dblp-testbed regime` map: its summary, tables, report and heat-maps."""

    kind: ClassVar[str] = "regime"
    study_kind: ClassVar[type[Study]] = RegimeMap


REFERENCES: dict[str, Reference] = {}
#: Not a reference: blocks naming it are rendered from every reference.
EVERY = "all"


def register(ref: Reference) -> Reference:
    if ref.name == EVERY or (ref.name in REFERENCES and REFERENCES[ref.name] != ref):
        raise ValueError(f"reference {ref.name!r} is already registered")
    REFERENCES[ref.name] = ref
    return ref


register(RunReference("default", "default",
                      "what `dblp-testbed run` does with no argument: the like-for-like arms, "
                      "seeds and bursts of the default preset"))
register(RunReference("paper", "paper",
                      "the paper's star with the parameter server, both control paths, "
                      "five bursts at each of 60/70/80/90 %"))
# The prototype's costs but its 8 KB chunks: with them the run stops at its
# first burst (a 1 s burst leaves the server's IP reassembly memory full of
# incomplete datagrams, and every fragmented one is dropped until they expire
# 30 s later, past the round deadline; docs/results/paper-prototype.md).
register(RunReference("paper-prototype", "paper-prototype",
                      "the paper preset with the authors' prototype's fixed chunk order, 1 s probe "
                      "wait and Nagle on TCP control (MTU-sized chunks)",
                      ("transport.chunk_bytes=1416",)))
register(RunReference("star", "star",
                      "the accuracy check: the paper's star without bursts, every transport arm, "
                      "400 rounds with the rate annealed, two seeds"))
# The transport bench with UDP control (TCP rows miss their deadlines for
# minutes at 50-80 % loss) and gloo beside it: gloo's two deadline misses at
# 50 and 80 % cost about a minute each, and its column is the like-for-like
# peer of the sharded rows.
register(CommandReference(
    "transport", "the transport benchmark: every bound, PS and sharded, UDP control, with and "
    "without a secret, and gloo's all-reduce, on a 100 Mbit/s veth pair at 0-80 % loss",
    (Command("bench-transport.json", ("bench", "transport", "--controls", "udp", "--reps", "3",
                                      "--losses", "0,0.1,0.5,0.8")),)))
#: Link rates (Mbit/s) and gradient sizes (MiB) of the line-rate bench: sizes that keep
#: a round trip above ~0.1 s; 100 Mbit/s is the transport reference's own rate. Medians
#: of 7: a round trip of 0.2-0.4 s varied by up to 25 % between repetitions here.
LINE_RATES = ((100, 4), (1000, 32), (3000, 32), (10000, 64))
#: Runs of the whole set, one after the other: the ratio of one run's medians moves by
#: a fifth or more between runs here (sharded / gloo at 10 Gbit/s: 1.19 to 1.44x in one
#: reference, 1.21 to 1.65x in another), so each line-rate claim is read from its range
#: over these runs, never from one.
LINE_RUNS = 5
register(CommandReference(
    "linerate", "the transport bench on faster links: reliable PS and sharded, UDP control, "
    f"no secret, and gloo's all-reduce, at 0 and 10 % loss, from 0.1 to 10 Gbit/s, "
    f"{LINE_RUNS} runs",
    tuple(Command(f"bench-transport-{r}mbit-run{i}.json",
                  ("bench", "transport", "--rate-mbit", str(r), "--mbytes", str(m),
                   "--losses", "0,0.1", "--controls", "udp", "--bounds", "0", "--auth", "off",
                   "--reps", "7", "--round-timeout", "60"))
          for i in range(1, LINE_RUNS + 1) for r, m in LINE_RATES)))
#: The fat-tree sizes `net check` builds for its results page (k=8 routes in ~20 s).
FABRIC_KS = (4, 6, 8)
register(CommandReference(
    "fabric", "`net check` of the fat-tree at each size: start-up, reachability, core spread, "
    "one TCP flow", tuple(Command(f"net-check-k{k}.json", ("net", "check", "--k", str(k)))
                          for k in FABRIC_KS)))
#: Shaping rates (Mbit/s) and concurrent flows of the capacity table.
CAPACITY_RATES, CAPACITY_FLOWS = (20, 30, 40, 50, 60, 100), (1, 4)
register(CommandReference(
    "capacity", "cross-pod TCP goodput on the k=4 fat-tree at each shaping rate, one flow and "
    "four at once: where the emulator, not the link, sets the rate",
    tuple(Command(f"net-check-bw{b}-flows{f}.json",
                  ("net", "check", "--bw", str(b), "--flows", str(f)))
          for b in CAPACITY_RATES for f in CAPACITY_FLOWS)))
# The detector's ablation (testbed.run.ablation): about an hour.
register(AblationReference(
    "detector", "detector", "DBLP's P_high, phase threshold and detector signal, each varied "
    "alone on the paper's set-up over three seeds, against static and static-high"))
register(CommandReference(
    "bursts", "requested against measured burst loss and timing on the k=4 fat-tree",
    (Command("bench-bursts.json", ("bench", "bursts")),)))
# The reduced burst regime map (testbed.run.regime): at most 30 minutes.
register(RegimeReference(
    "regime", "reduced", "the reduced burst regime map: 90 % bursts of 200 ms and 1 s, "
    "round-locked 60 % ones, both control paths, the pull path and congestion, both bounds "
    "and gloo"))


def select(names: tuple[str, ...] | list[str]) -> list[Reference]:
    """The references called ``names`` (all when empty); an unknown name is an InputError."""
    if not names:
        return list(REFERENCES.values())
    unknown = [n for n in names if n not in REFERENCES]
    if unknown:
        raise InputError(f"unknown reference {unknown[0]!r}; choose from {', '.join(REFERENCES)}")
    return [REFERENCES[n] for n in names]


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


def read_record(ref_dir: pathlib.Path) -> dict:
    """A reference folder's reproduce.json; a missing file or an unknown version is an InputError."""
    path = ref_dir / RECORD
    if not path.is_file():
        raise InputError(f"{path} does not exist; run `dblp-testbed reproduce {ref_dir.name}`")
    rec = json.loads(path.read_text())
    if rec.get("schema", RECORD_SCHEMA) != RECORD_SCHEMA:
        raise InputError(f"{path} has schema {rec['schema']}; this version reads "
                         f"{RECORD_SCHEMA} only: run `dblp-testbed reproduce {ref_dir.name}`")
    return rec


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
            status, record = ref.produce(out)
        except TestbedError as exc:
            status, record = str(exc), {}
        wall = round(time.monotonic() - t0, 1)
        if status == "ok":
            rec = {"schema": RECORD_SCHEMA, "kind": ref.kind, **record, "wall_s": wall}
            try:
                keep(out, reference_dir / ref.name, ref.kept_files(), rec)
            except TestbedError as exc:
                status = str(exc)
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
    from testbed.analysis import readme as rd

    names = tuple(only) or tuple(REFERENCES)
    ready = tuple(n for n in names if (reference_dir / n / RECORD).is_file())
    if all((reference_dir / n / RECORD).is_file() for n in REFERENCES):
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
              help="Run nothing: re-render the tables of the README and docs/ from "
                   "results/reference/.")
@json_option
def reproduce_cmd(names, runs_root, readme_only, json_out):
    """Regenerate the measured tables from scratch: every reference (or NAMES).

    A reference is a preset run or a set of other commands (benches, net
    checks); its small output files replace results/reference/NAME/
    (commit them); then the marked tables of the README and of docs/ (one
    page per reference under docs/results/; of NAMES, if given, and the
    table of every reference's wall time) are re-rendered from them.
    """
    refs = select(names)
    done = {} if readme_only else reproduce(refs, pathlib.Path(runs_root))
    changed, no_data = update_readme(only=tuple(names))
    failed = [n for n, e in done.items() if e["status"] != "ok"]
    doc = {"runs": done, "readme_tables_changed": changed, "failed": failed,
           "references_without_data": no_data}

    def text():
        for n, e in done.items():
            click.echo(f"{n}: {e['status']} in {e['wall_s'] / 60:.1f} min ({e['run_dir']})")
        click.echo(f"tables re-rendered: {', '.join(changed) or 'none changed'}")
        if no_data:
            click.echo(f"no committed data yet (their blocks left as they are): "
                       f"{', '.join(no_data)}")

    results(doc, json_out, text)
    if failed:
        raise ExperimentFailed(f"reference run(s) {', '.join(failed)} failed; their "
                               "results/reference/ folders were left unchanged")
