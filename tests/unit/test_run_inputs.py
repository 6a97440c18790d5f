"""`dblp-testbed run` inputs that are not specs: spec files, --out paths, run directories.

Like the bad specs: exit 2, one line naming what is wrong, nothing created.
None of these may reach the emulator: `run_experiment` is replaced by a trap.
"""
import pathlib
import tomllib

import pytest
from click.testing import CliRunner

from testbed.cli import main
from testbed.config.presets import PRESETS
from testbed.config.spec import Spec, load


@pytest.fixture(autouse=True)
def _never_emulate(monkeypatch):
    """A unit test must never build a fabric (the machine's one Mininet slot is not ours)."""
    from testbed.run import runner

    def trap(*a, **k):
        raise AssertionError("run_experiment reached from a unit test")

    monkeypatch.setattr(runner, "run_experiment", trap)


def _run(*args):
    return CliRunner().invoke(main, ["run", *args])


def _one_line_exit_2(res, *words):
    assert res.exit_code == 2, (res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.unit
@pytest.mark.parametrize("content", [
    bytes(range(256)),                                # binary
    "name = 'caf\u00e9'\n".encode("latin-1"),          # not UTF-8
    "[topology]\nk = 4\n".encode("utf-16"),            # UTF-16 with a byte-order mark
], ids=["binary", "latin-1", "utf-16"])
def test_binary_or_non_utf8_spec_is_one_line_exit_2_and_creates_nothing(tmp_path, content):
    spec = tmp_path / "bad.toml"
    spec.write_bytes(content)
    out = tmp_path / "run"
    _one_line_exit_2(_run(str(spec), "--out", str(out)), "'SPEC'")
    assert not out.exists()


@pytest.mark.unit
def test_spec_that_is_a_directory_is_one_line_exit_2(tmp_path):
    _one_line_exit_2(_run(str(tmp_path), "--out", str(tmp_path / "run")), "'SPEC'")


@pytest.mark.unit
@pytest.mark.parametrize("where", ["beneath-a-file", "a-file", "not-empty", "unwritable"])
def test_unusable_out_is_one_line_exit_2_and_creates_nothing(tmp_path, where):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("x")
    out = {"beneath-a-file": blocker / "sub" / "run", "a-file": blocker, "not-empty": full,
           # root may write anywhere its permissions say; /proc refuses every new name
           "unwritable": pathlib.Path("/proc/dblp-testbed-unit/run")}[where]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    _one_line_exit_2(_run("--preset", "smoke", "--out", str(out)), "--out")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


@pytest.mark.unit
def test_run_directories_of_runs_started_in_the_same_second_do_not_collide(tmp_path, monkeypatch):
    """Another run takes each name between a look and a claim: no look may decide."""
    from testbed import rundir

    results = tmp_path / "results"
    monkeypatch.chdir(tmp_path)
    spec = load(None, PRESETS["smoke"])
    real = rundir._dt.datetime

    class Frozen(real):
        @classmethod
        def now(cls, tz=None):
            return real(2030, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(rundir._dt, "datetime", Frozen)
    other = results / "smoke-20300102T030405Z"
    (other / "raw").mkdir(parents=True)  # the other run, started in the same second
    monkeypatch.setattr(pathlib.Path, "exists", lambda self: False)  # ... after we looked
    dirs = [rundir.new_run_dir(spec, None) for _ in range(2)]
    assert [d.name for d in dirs] == ["smoke-20300102T030405Z-2", "smoke-20300102T030405Z-3"]
    assert all((d / "raw").is_dir() and (d / "spec.toml").is_file() for d in dirs)
    assert not (other / "spec.toml").is_file()  # the other run's directory is untouched


@pytest.mark.unit
def test_of_two_runs_given_the_same_empty_out_one_is_refused(tmp_path, monkeypatch):
    """The first claims it between the second's look (empty) and its claim."""
    from testbed.rundir import RunDirError, new_run_dir

    spec = load(None, PRESETS["smoke"])
    out = tmp_path / "run"
    out.mkdir()
    assert new_run_dir(spec, str(out)) == out
    monkeypatch.setattr(pathlib.Path, "iterdir", lambda self: iter(()))  # it looked empty
    with pytest.raises(RunDirError):
        new_run_dir(spec, str(out))


@pytest.mark.unit
def test_default_run_directory_is_the_working_directorys_results(tmp_path, monkeypatch):
    """Installed from a wheel, the package's parent is site-packages: runs go where the user is.
    From the repository's root (the README's commands) that is the checkout's results/."""
    from testbed import rundir

    repo = pathlib.Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    assert rundir.results_dir() == repo / "results"
    monkeypatch.chdir(tmp_path)
    assert rundir.results_dir() == tmp_path / "results"
    spec = load(None, PRESETS["smoke"])
    made = rundir.new_run_dir(spec, None)
    assert made.parent == tmp_path / "results" and (made / "spec.toml").is_file()


DESCRIPTION = ("tab\tbell\x07 escape\x1b[31m del\x7f\nsecond line\r\n\"quoted\" '''triple''' "
               '"""triple""" \\ back\\slash \u2028 end')
PARAMS = {"odd key": 1, "": 2, "\u00fcn\u00efcode": 3, "a.b": 4, "[x]": 5, 'quote"d': 6,
          "new\nline": 7, "#hash": 8, "p": 0.5}


@pytest.mark.unit
def test_spec_toml_always_parses_again_with_control_characters_and_odd_keys():
    spec = load(None, PRESETS["smoke"])
    data = dict(spec.data)
    data[""] = dict(data[""], description=DESCRIPTION)
    data["bursts"] = [dict(data["bursts"][0], params=PARAMS)]
    again = tomllib.loads(Spec(data).to_toml())
    assert again["description"] == DESCRIPTION
    assert again["bursts"][0]["params"] == PARAMS
    assert again["training"] == spec["training"]


@pytest.mark.unit
def test_spec_file_with_multiline_and_control_characters_round_trips(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('description = """first\nsecond \\u0001 \\t tab\n"""\n', encoding="utf-8")
    spec = load(str(f), PRESETS["smoke"])
    text = spec.data[""]["description"]
    assert "\x01" in text and "\n" in text
    assert tomllib.loads(spec.to_toml())["description"] == text
    res = _run(str(f), "--preset", "smoke", "--dry-run")
    assert res.exit_code == 0, res.output
    assert tomllib.loads(res.stdout)["description"] == text


@pytest.mark.unit
def test_run_directory_spec_toml_parses_to_the_resolved_spec(tmp_path):
    from testbed.rundir import new_run_dir

    base = load(None, PRESETS["smoke"])
    spec = Spec(dict(base.data, **{"": dict(base.data[""], description=DESCRIPTION)}))
    run_dir = new_run_dir(spec, str(tmp_path / "run"))
    doc = tomllib.loads((run_dir / "spec.toml").read_text(encoding="utf-8"))
    assert doc["description"] == DESCRIPTION
    assert doc["arms"] == spec.arms


def test_a_run_keeps_the_dissector_of_its_captures(tmp_path):
    """raw/dblp.lua: the dissector generated by the code that wrote the run's pcaps."""
    from dblp.wireshark import lua_dissector
    from testbed.rundir import DISSECTOR, write_dissector
    (tmp_path / "raw").mkdir()
    path = write_dissector(tmp_path)
    assert path == tmp_path / "raw" / DISSECTOR
    assert path.read_text() == lua_dissector() and 'Proto("dblp"' in path.read_text()
