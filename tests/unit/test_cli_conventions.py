"""The command line's conventions: --version, -q/-v, one --json, licence and citation files."""
import importlib.metadata
import json
import pathlib
import subprocess
import sys
import tomllib

import click
import pytest
import yaml
from click.testing import CliRunner

from testbed import output
from testbed.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]
# Every command that prints results, by its path under `dblp-testbed`.
RESULT_COMMANDS = [("doctor",), ("net", "check"), ("clean",), ("bench", "bursts"), ("compare",),
                   ("bench", "transport")]


def test_version_is_the_installed_distribution_version():
    out = subprocess.run(CLI + ["--version"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0
    first = out.stdout.splitlines()[0]
    assert first == f"dblp-testbed, version {importlib.metadata.version('dblp-testbed')}"


@pytest.mark.parametrize("path", RESULT_COMMANDS, ids=" ".join)
def test_every_result_command_takes_one_json_option(path):
    cmd: click.Command = main
    for name in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.get_command(click.Context(cmd), name)
    opts = [p for p in cmd.params if "--json" in getattr(p, "opts", ())]
    assert len(opts) == 1, path
    assert opts[0].name == "json_stdout" and opts[0].is_flag  # a flag: it takes no word
    files = [p for p in cmd.params if "--json-file" in getattr(p, "opts", ())]
    assert len(files) == 1 and not files[0].is_flag, path


def test_results_go_to_stdout_as_json_or_text_and_to_a_file(tmp_path, capsys):
    obj = {"ok": True, "rows": [1, 2]}
    output.results(obj, "-", lambda: click.echo("TEXT"))
    out = capsys.readouterr()
    assert json.loads(out.out) == obj and "TEXT" not in out.out
    assert out.out.count("\n") == 1  # one line: scripts may read the last line
    output.results(obj, None, lambda: click.echo("TEXT"))
    assert capsys.readouterr().out == "TEXT\n"
    path = tmp_path / "r.json"
    output.results(obj, str(path), lambda: click.echo("TEXT"))
    assert capsys.readouterr().out == "TEXT\n" and json.loads(path.read_text()) == obj


def test_quiet_and_verbose_set_what_goes_to_stderr(capsys):
    try:
        for flags, shown in (((), {"say", "warn"}), (("-q",), {"warn"}),
                             (("-v",), {"say", "detail", "warn"})):
            res = CliRunner().invoke(main, [*flags, "run", "--preset", "smoke", "--dry-run"])
            assert res.exit_code == 0, res.output
            output.say("say")
            output.detail("detail")
            output.warn("warn")
            err = capsys.readouterr().err
            assert {w for w in ("say", "detail", "warn") if f"{w}\n" in err} == shown, flags
    finally:
        output.set_level(output.NORMAL)


def test_licence_and_citation_agree_with_the_package():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT" and meta["license-files"] == ["LICENSE"]  # the SPDX form
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "MIT"
    assert cff["version"] == meta["version"]
    assert any("2605.01989" in i["value"] for r in cff["references"] for i in r["identifiers"])
