"""The `dblp-testbed` command line.

Each command lives in the module that owns its subject and is registered
here by name (`COMMANDS`), imported only when it runs (`testbed.cli.lazy`):
a `clean` does not import the analysis' pandas, nor a `burst` torch. This
file only wires them together and maps errors to exit codes (2: bad input,
nothing created; 1: the experiment failed; 3: `run` finished but some unit
broke an emulator invariant, `testbed.errors.InvalidUnits`).
"""
import signal
import sys
import warnings

import click

from testbed import output
from testbed.cli.lazy import LazyGroup
from testbed.config.presets import PRESETS
from testbed.errors import TestbedError

#: The commands other modules own: name -> "module:attribute", imported when used.
COMMANDS = {
    "report": "testbed.analysis.pipeline:report_cmd",
    "compare": "testbed.analysis.compare:compare_cmd",
    "reproduce": "testbed.run.reproduce:reproduce_cmd",
    "ablate": "testbed.run.ablation:ablate_cmd",
    "regime": "testbed.run.regime:regime_cmd",
    "doctor": "testbed.cli.fabric:doctor",
    "net": "testbed.cli.fabric:net",
    "clean": "testbed.cli.fabric:clean",
    "burst": "testbed.cli.fabric:burst",
    "wireshark": "testbed.cli.wireshark:wireshark_cmd",
}
#: `dblp-testbed bench ...`, alike.
BENCH_COMMANDS = {
    "transport": "testbed.bench.transport:transport_cmd",
    "collectives": "testbed.bench.collectives:collectives_cmd",
    "bursts": "testbed.cli.fabric:bench_bursts",
    "flood": "testbed.bench.flood:flood_cmd",
}


def fail(message: str, code: int = 2):
    """One actionable line on stderr, then exit (2 = bad input)."""
    click.echo(f"dblp-testbed: error: {message}", err=True)
    sys.exit(code)


class _Main(LazyGroup):
    """The one place where a `TestbedError` becomes a line and an exit code, and where the
    libraries' warnings are kept off the terminal."""

    def invoke(self, ctx):
        # A library's warning (matplotlib's UserWarning on an empty plot, a
        # deprecation) says nothing a user of the command can act on, and it
        # buried the one line that mattered; -v still shows each, on one line.
        with warnings.catch_warnings():
            warnings.showwarning = _warning_as_detail
            try:
                return super().invoke(ctx)
            except TestbedError as exc:
                fail(str(exc), exc.exit_code)


def _warning_as_detail(message, category, filename, lineno, file=None, line=None):
    """`warnings.showwarning` for the command line: the warning at -v only (`output.detail`)."""
    output.detail(f"{category.__name__}: {message} ({filename}:{lineno})")


class _ArmList(click.ParamType):
    """``A,B,...``: arm names of the registry (`testbed.config.arms.ARMS`), checked by the spec.

    The spec validates the list (one line naming the field), so an unknown
    arm fails the same way from ``--arms``, ``--set arms=`` and a spec file.
    """

    name = "A,B,..."

    def get_metavar(self, param, ctx=None):
        from testbed.config.arms import ARMS  # the transport's registries: only for the help
        return "[" + "|".join(ARMS) + "],..."

    def convert(self, value, param, ctx):
        return value


def version_lines() -> list[str]:
    """What `--version` prints: the distribution's version, the commit, whether the C core loaded.

    Why more than the version: 0.1.0 names every commit of this project, and
    a run's timings move with the C core (`testbed.emulation.capabilities.c_core`),
    so a bug report or a comparison needs all three. The commit is the one of
    the checkout the ``testbed`` package was imported from, and only when that
    is a git checkout: an installed copy has none and says so.
    """
    import importlib.metadata
    import subprocess

    from testbed import REPO_ROOT
    from testbed.emulation.capabilities import c_core

    try:
        version = importlib.metadata.version("dblp-testbed")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown (the package is not installed)"

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True,
                                 text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    rev = git("rev-parse", "HEAD") if (REPO_ROOT / ".git").exists() else None
    if rev is None:
        commit = "commit: unknown (not run from a git checkout)"
    else:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        commit = f"commit: {rev}" + (" (with uncommitted changes)" if dirty else "")
    core = c_core()
    loaded = (f"C core: loaded (keyed jobs' tags: {core['mac'] or 'in Python'})" if core["loaded"]
              else f"C core: NOT loaded ({core['error']}); the transport runs its pure-Python path")
    return [f"dblp-testbed, version {version}", commit, loaded]


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    for line in version_lines():
        click.echo(line)
    ctx.exit()


@click.group(cls=_Main, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the version, the git commit and whether dblp's C core loaded, then exit.")
@click.option("-q", "--quiet", "quiet", count=True, help="Less progress on stderr (results and errors stay).")
@click.option("-v", "--verbose", "verbose", count=True, help="More progress on stderr (fabric steps).")
def main(quiet, verbose):
    """Emulated fat-tree testbed for bounded-loss gradient transports."""
    output.set_level(output.NORMAL - quiet + verbose)
    # A background job of a shell script starts with SIGINT ignored, and Python
    # keeps it so: Ctrl-C or `kill -INT` would then let a half-built fabric or a
    # run go on to completion instead of tearing it down. Every command relies
    # on KeyboardInterrupt for that, so take the signal back here, once.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@main.command()
# Paths are checked by the spec loader and `check_out`, one line each.
@click.argument("spec_file", required=False, type=click.Path())
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default=None,
              help="Base preset (default: 'default'); SPEC_FILE fields override it.")
@click.option("--out", type=click.Path(), default=None,
              help="Run directory (must not exist or be empty). Default: results/NAME-TIME "
                   "under the working directory.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.FIELD=VALUE",
              help="Override any spec field, e.g. --set training.rounds=50 (repeatable).")
@click.option("--arms", type=_ArmList(), default=None,
              help="Arms to run, comma-separated.")
@click.option("--rounds", type=int, default=None, help="Training rounds per arm.")
@click.option("--seed", type=int, default=None,
              help="First seed (data, model); the burst schedule's seed.")
@click.option("--seeds", type=int, default=None,
              help="Run every arm once per seed: --seed, --seed+1, ... (= --set seeds=N).")
@click.option("--dry-run", is_flag=True, help="Validate and print the resolved spec; run nothing.")
@output.json_option
def run(spec_file, preset, out, overrides, arms, rounds, seed, seeds, dry_run, json_out):
    """Run an experiment: fabric, controller, bursts, every arm; then `report` on it.

    Ends with its answer on stdout: the verdict on each claim and pair
    (point, 95 % interval, verdict), then every unit that broke an emulator
    invariant (testbed/invariants.py), which is left out of every figure,
    interval and verdict.

    \b
    Exit codes: 0 every arm finished and every unit is valid;
    1 an arm failed or the run was stopped; 2 bad input (nothing run);
    3 every arm finished but some unit is invalid (its verdicts may be
    "not judged"). Results and logs stay in the run directory whatever the code.
    """
    from testbed.config import spec as specmod
    from testbed.rundir import check_out

    overrides = list(overrides)
    if arms is not None:
        overrides.append(f"arms={arms}")
    if rounds is not None:
        overrides.append(f"training.rounds={rounds}")
    if seed is not None:
        overrides.append(f"seed={seed}")
    if seeds is not None:
        overrides.append(f"seeds={seeds}")
    spec = specmod.load(spec_file, PRESETS[preset or "default"], overrides)
    if dry_run:
        click.echo(spec.to_toml(), nl=False)
        return
    check_out(out)  # before anything is built or created
    from testbed.errors import ExperimentFailed, InvalidUnits
    from testbed.run.experiment import INVALID, run_and_report
    status = run_and_report(spec, out, json_out)
    sys.exit(0 if status == "ok" else InvalidUnits.exit_code if status == INVALID
             else ExperimentFailed.exit_code)


@main.command()
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Output directory: sweep.csv, sweep.json, report.md.")
@click.option("--model", default="digits_cnn", show_default=True, help="Model registry name.")
@click.option("--workers", type=int, default=3, show_default=True, help="Simulated workers.")
@click.option("--rounds", type=int, default=300, show_default=True, help="Training rounds per run.")
@click.option("--fractions", default="0,0.2,0.4,0.6,0.8", show_default=True,
              help="Forced gradient drop fractions.")
@click.option("--phases", default="early,middle,late", show_default=True,
              help="Training phases the drop window is placed in, comma-separated.")
@click.option("--window", type=float, default=0.25, show_default=True,
              help="Share of the rounds one phase window spans.")
@click.option("--seeds", default="0,1,2", show_default=True, help="Seeds, comma-separated.")
@click.option("--order", type=click.Choice(["random", "tail"]), default="random", show_default=True,
              help="Which chunks go missing: a seeded random subset, or always the tail.")
def sweep(out, model, workers, rounds, fractions, phases, window, seeds, order):
    """Loss-tolerance sweep: accuracy vs forced gradient drops early/mid/late (workloads.sweep)."""
    import subprocess

    argv = [sys.executable, "-m", "workloads.sweep", "--out", out, "--model", model,
            "--workers", str(workers), "--rounds", str(rounds), "--fractions", fractions,
            "--phases", phases, "--window", str(window), "--seeds", seeds, "--order", order]
    sys.exit(subprocess.call(argv))


@main.group(cls=LazyGroup, lazy=BENCH_COMMANDS)
def bench():
    """Benchmarks: `transport` (DBLP vs gloo on a shaped veth pair), `collectives` (nccl-tests'
    size sweep of all_reduce, all_gather and reduce_scatter on the same pair), `bursts` (on the
    fabric), `flood` (honest rounds under a flood of forged datagrams, on loopback)."""
