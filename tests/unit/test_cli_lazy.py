"""The command line imports a command's module only when that command runs.

Every test that starts `dblp-testbed` (hundreds per suite) paid for pandas
and the whole analysis before: `clean`, `burst` and `--help` need neither.
"""
import json
import subprocess
import sys

import click
import pytest

from testbed.cli import BENCH_COMMANDS, COMMANDS, main
from testbed.cli.lazy import LazyGroup

pytestmark = pytest.mark.unit

#: Libraries only some commands need, each a large import.
HEAVY = ("pandas", "torch", "scapy", "matplotlib")
#: Commands whose module is the analysis itself: their --help loads it.
ANALYSIS = {("report",)}

_PROBE = """
import json, sys
from click.testing import CliRunner
from testbed.cli import main
seen = {}
for path in json.loads(sys.argv[1]):
    res = CliRunner().invoke(main, [*path, "--help"])
    assert res.exit_code == 0, (path, res.output)
    seen[" ".join(path) or "(main)"] = sorted(m for m in sys.argv[2:] if m in sys.modules)
print(json.dumps(seen))
"""


def _paths():
    return [[], *([n] for n in COMMANDS), ["bench"], *(["bench", n] for n in BENCH_COMMANDS),
            ["run"], ["sweep"], ["net", "check"], ["net", "cli"]]


def test_help_and_every_command_but_the_analysis_import_none_of_the_heavy_libraries():
    light = [p for p in _paths() if tuple(p) not in ANALYSIS]
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(light), *HEAVY], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {" ".join(p) or "(main)": [] for p in light}


@pytest.mark.parametrize("group,lazy", [(main, COMMANDS), (main.commands["bench"], BENCH_COMMANDS)],
                         ids=["main", "bench"])
def test_the_help_listing_read_from_source_is_the_loaded_commands_help(group, lazy):
    """The listing shows each command's first docstring line without importing it: the same
    line click shows once the command is loaded."""
    unloaded = LazyGroup(lazy=lazy)
    for name in lazy:
        cmd = group.get_command(click.Context(group), name)
        assert cmd is not None and cmd.name == name
        assert unloaded.listed_help(name) == cmd.get_short_help_str(45), name
        assert name not in unloaded.commands   # read from the source, not imported


def test_a_command_registered_under_another_name_is_refused():
    group = LazyGroup(lazy={"tidy": "testbed.cli.fabric:clean"})
    with pytest.raises(RuntimeError, match="'clean', registered as 'tidy'"):
        group.get_command(click.Context(group), "tidy")


def test_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "testbed.cli", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0] for line in out.stdout.split("Commands:", 1)[1].splitlines()
              if line.startswith("  ") and line.split()}
    assert listed == {*COMMANDS, "bench", "run", "sweep"}
