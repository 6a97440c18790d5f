"""The command line has no traps: ``--json`` takes no word, every option says what it does,
one name for the link rate, ``--version`` says what runs, shell completion works, and a run
refused before its first unit prints its reason and nothing else."""
from __future__ import annotations

import json
import pathlib
import subprocess
import warnings

import click
import pytest
from click.testing import CliRunner

from testbed import output
from testbed.cli import main, version_lines
from testbed.options import rate_option

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _walk(cmd: click.Command, path: tuple[str, ...] = ()):
    """Every command under ``cmd`` (lazy ones loaded), with its path of names."""
    yield path, cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            yield from _walk(cmd.get_command(ctx, name), (*path, name))


COMMANDS = dict(_walk(main))
JSON_COMMANDS = sorted(p for p, c in COMMANDS.items() if output.has_json_option(c))
#: What a command needs besides its positional argument to parse at all.
REQUIRED = {("compare",): ["--reference", "ref.json"]}
#: A positional argument for the commands that need one.
POSITIONAL = {("report",): ["RUN_DIR"], ("compare",): ["RUN"], ("ablate",): ["smoke"],
              ("regime",): ["smoke"]}


def _parse(args: list[str]) -> click.Context:
    """``dblp-testbed ARGS`` parsed as the command line parses it (each group resolving its
    command), without running anything."""
    ctx = click.Context(main, info_name="dblp-testbed")
    cmd: click.Command = main
    rest = list(args)
    while isinstance(cmd, click.Group):
        name, sub, rest = cmd.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        cmd = sub
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd, parent=ctx, info_name=name)
    return cmd.make_context(name, rest, parent=ctx)


def test_the_json_commands_are_every_command_that_prints_results():
    assert {" ".join(p) for p in JSON_COMMANDS} >= {
        "run", "report", "compare", "reproduce", "ablate", "regime", "doctor", "net check", "clean",
        "bench bursts", "bench transport"}


@pytest.mark.parametrize("path", JSON_COMMANDS, ids=" ".join)
def test_json_never_takes_a_word_that_names_a_file(path, tmp_path, monkeypatch):
    """``CMD --json my.toml``: my.toml is never the output file; it is the command's
    argument (run, report, ...) or refused as an extra word (doctor, clean, ...)."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "my.toml"
    mine.write_text('name = "mine"\n')
    try:
        ctx = _parse([*path, "--json", "my.toml", *REQUIRED.get(path, [])])
    except click.UsageError as exc:
        assert "my.toml" in str(exc)  # refused: "Got unexpected extra argument (my.toml)"
    else:
        assert ctx.params["json_stdout"] is True and ctx.params["json_file"] is None
        assert "my.toml" in json.dumps(ctx.params, default=str)  # the argument it was meant as
    assert mine.read_text() == 'name = "mine"\n'


@pytest.mark.parametrize("path", JSON_COMMANDS, ids=" ".join)
def test_json_as_a_flag_and_the_file_under_its_own_option(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = POSITIONAL.get(path, []) + REQUIRED.get(path, [])
    flag = _parse([*path, "--json", *args]).params
    assert flag["json_stdout"] is True and flag["json_file"] is None
    to_file = _parse([*path, *args, "--json-file", "out.txt"]).params
    assert to_file["json_stdout"] is False and to_file["json_file"] == "out.txt"
    # the old spelling, where it cannot hurt: a .json file that is not there yet
    old = _parse([*path, "--json", "new.json", *args]).params
    assert old["json_stdout"] is False and old["json_file"] == "new.json"
    assert _parse([*path, *args, "--json=-"]).params["json_stdout"] is True
    (tmp_path / "old.json").write_text("{}")
    assert _parse([*path, *args, "--json=old.json"]).params["json_file"] == "old.json"
    with pytest.raises(click.UsageError, match="--json-file"):
        _parse([*path, *args, "--json=my.toml"])


def test_report_and_compare_keep_their_run_after_json():
    assert _parse(["report", "--json", "RUN_DIR"]).params["run_dir"] == "RUN_DIR"
    compare = _parse(["compare", "--json", "RUN", "--reference", "ref.json"]).params
    assert compare["runs"] == ("RUN",) and compare["json_stdout"] is True


def test_run_json_my_toml_runs_my_toml_and_leaves_it_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "my.toml"
    mine.write_text('name = "mine"\n')
    res = CliRunner().invoke(main, ["run", "--json", "my.toml", "--preset", "smoke", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert 'name = "mine"' in res.stdout  # the resolved spec is my.toml's
    assert mine.read_text() == 'name = "mine"\n'


def test_json_and_json_file_together_are_refused(tmp_path):
    res = CliRunner().invoke(main, ["clean", "--dry-run", "--json", "--json-file", str(tmp_path / "x")])
    assert res.exit_code == 2 and "give one of them" in res.output
    assert not (tmp_path / "x").exists()


def test_every_option_has_help():
    missing = [f"{' '.join(path) or '(main)'} {p.opts[0]}" for path, cmd in COMMANDS.items()
               for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert missing == []


def test_one_name_for_the_link_rate_the_old_ones_hidden():
    rate = {path: [p for p in cmd.params if isinstance(p, click.Option)
                   and {"--rate-mbps", "--bw", "--rate-mbit"} & set(p.opts)]
            for path, cmd in COMMANDS.items()}
    for path in [("net", "check"), ("net", "cli"), ("bench", "bursts"), ("bench", "transport"),
                 ("report",)]:
        shown = [p for p in rate[path] if not p.hidden]
        assert [p.opts for p in shown] == [["--rate-mbps"]], path
    hidden = {o for opts in rate.values() for p in opts if p.hidden for o in p.opts}
    assert hidden == {"--bw", "--rate-mbit"}
    for path in [("net", "check"), ("bench", "transport")]:
        res = CliRunner().invoke(main, [*path, "--help"])
        assert "--rate-mbps" in res.output and "--bw" not in res.output
        assert "--rate-mbit" not in res.output
    assert _parse(["net", "check", "--bw", "30"]).params["_alias_of_bw"] == 30.0
    old = _parse(["bench", "transport", "--rate-mbit", "1000"]).params
    assert old["_alias_of_rate_mbit"] == 1000.0


def test_a_hidden_alias_sets_the_option_and_both_together_are_refused():
    @click.command()
    @rate_option("bw", 20.0, "Link rate.", old_names=("--bw",))
    def cmd(bw):
        click.echo(f"rate {bw}")

    assert CliRunner().invoke(cmd, []).output == "rate 20.0\n"
    assert CliRunner().invoke(cmd, ["--bw", "30"]).output == "rate 30.0\n"
    assert CliRunner().invoke(cmd, ["--rate-mbps", "40"]).output == "rate 40.0\n"
    both = CliRunner().invoke(cmd, ["--rate-mbps", "40", "--bw", "30"])
    assert both.exit_code == 2 and "--rate-mbps and its old name --bw" in both.output
    # the real commands refuse it before they start anything (bench transport: before root)
    res = CliRunner().invoke(main, ["bench", "transport", "--rate-mbps", "5", "--rate-mbit", "6"])
    assert res.exit_code == 2 and "old name --rate-mbit" in res.output


def test_version_prints_the_version_the_commit_and_the_c_core():
    from testbed.emulation.capabilities import c_core

    res = CliRunner().invoke(main, ["--version"])
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert lines == version_lines() and len(lines) == 3
    assert lines[0].startswith("dblp-testbed, version ")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert lines[1].startswith(f"commit: {head}" if head else "commit: unknown")
    assert lines[2].startswith("C core: loaded" if c_core()["loaded"] else "C core: NOT loaded")


def test_version_of_an_installed_copy_names_no_commit(tmp_path, monkeypatch):
    """Installed from a wheel the package's parent is no checkout: no commit is guessed."""
    import testbed

    monkeypatch.setattr(testbed, "REPO_ROOT", tmp_path)
    assert version_lines()[1] == "commit: unknown (not run from a git checkout)"


def test_shell_completion_as_docs_commands_shows_it():
    doc = (ROOT / "docs" / "commands.md").read_text()
    assert 'eval "$(_DBLP_TESTBED_COMPLETE=bash_source dblp-testbed)"' in doc
    source = CliRunner().invoke(main, [], prog_name="dblp-testbed",
                                env={"_DBLP_TESTBED_COMPLETE": "bash_source"})
    assert source.exit_code == 0 and "complete -o nosort -F _dblp_testbed_completion" in source.output
    done = CliRunner().invoke(main, [], prog_name="dblp-testbed", env={
        "_DBLP_TESTBED_COMPLETE": "bash_complete", "COMP_WORDS": "dblp-testbed net check --r",
        "COMP_CWORD": "3"})
    assert "plain,--rate-mbps" in done.output.splitlines()
    hidden = CliRunner().invoke(main, [], prog_name="dblp-testbed", env={
        "_DBLP_TESTBED_COMPLETE": "bash_complete", "COMP_WORDS": "dblp-testbed net check --b",
        "COMP_CWORD": "3"})
    assert "--bw" not in hidden.output


def test_a_run_refused_before_its_first_unit_prints_its_reason_and_nothing_else(tmp_path,
                                                                                monkeypatch):
    """A cluster server that cannot be reached: one line, no verdict table, no library warning."""
    from testbed.run import experiment, runner
    from testbed.rundir import Manifest, new_run_dir

    out = tmp_path / "run"

    def refused_run(spec, out_arg):
        run_dir = new_run_dir(spec, out_arg)
        manifest = Manifest(run_dir, spec, {})
        output.say(f"run directory: {run_dir}")
        warnings.warn("Attempting to set identical low and high xlims", UserWarning, stacklevel=1)
        manifest.finish("error", "PreflightError: server2: ssh: connect: No route to host")
        output.warn("dblp-testbed: run error: PreflightError: server2: ssh: connect: No route to host")
        return runner.Finished("error", run_dir)

    def no_analysis(run_dir):
        raise AssertionError("a run without a unit is not analysed")

    monkeypatch.setattr(runner, "run_experiment", refused_run)
    monkeypatch.setattr(experiment, "report_kept", no_analysis)
    res = CliRunner().invoke(main, ["run", "--preset", "smoke", "--out", str(out)])
    assert res.exit_code == 1
    assert res.stdout == ""  # no verdict table
    assert res.stderr.splitlines() == [f"run directory: {out}",
                                       "dblp-testbed: run error: PreflightError: server2: ssh: "
                                       "connect: No route to host"]
    assert "Warning" not in res.output
    as_json = CliRunner().invoke(main, ["run", "--preset", "smoke", "--out", str(tmp_path / "r2"),
                                        "--json"])
    obj = json.loads(as_json.stdout)  # scripts still read one object
    assert obj["status"] == "error" and as_json.exit_code == 1


def test_library_warnings_show_only_at_verbose(capsys):
    """Any command: a library's warning becomes one -v line, never a terminal's two-line warning."""
    @main.command("warn-probe", hidden=True)
    def probe():
        warnings.warn("a library's complaint", UserWarning, stacklevel=1)

    try:
        quiet = CliRunner().invoke(main, ["warn-probe"])
        assert quiet.exit_code == 0 and quiet.output == ""
        loud = CliRunner().invoke(main, ["-v", "warn-probe"])
        assert "UserWarning: a library's complaint" in loud.output
    finally:
        main.commands.pop("warn-probe")
        output.set_level(output.NORMAL)
