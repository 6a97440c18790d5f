"""`.ci/run` cannot go green by skipping the emulation tests.

A throw-away suite with one ``emu`` test (it touches nothing) runs under the
project's own ``tests/conftest.py`` as a user without root (a plugin makes
``os.geteuid`` say so: the interpreter here is root's): a developer sees it
skipped, ``make test`` (what ``.ci/run`` runs; it sets
``DBLP_TESTBED_REQUIRE_EMU=1``) sees it fail.
"""
import ast
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _suite() -> pathlib.Path:
    d = pathlib.Path(tempfile.mkdtemp(prefix="dblp-ci-policy-"))
    shutil.copy(ROOT / "tests" / "conftest.py", d / "conftest.py")
    (d / "pytest.ini").write_text("[pytest]\nmarkers =\n    emu: x\n    e2e: x\n    unit: x\n")
    (d / "not_root.py").write_text("import os\n\nos.geteuid = lambda: 1000\n")
    (d / "test_emu.py").write_text("import pytest\n\n@pytest.mark.emu\ndef test_x():\n    pass\n")
    return d


def _pytest_without_root(suite: pathlib.Path, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "DBLP_TESTBED_REQUIRE_EMU")}
    base["PYTHONPATH"] = str(suite)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "not_root", "-rs", str(suite)], cwd=suite, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def suite():
    d = _suite()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.unit
def test_make_test_which_ci_runs_requires_the_emulation_tests():
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "DBLP_TESTBED_REQUIRE_EMU=1 $(PY) -m pytest" in recipe
    assert "exec make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.unit
def test_without_root_a_developer_skips_and_ci_fails(suite):
    dev = _pytest_without_root(suite)
    assert dev.returncode == 0 and "skipped" in dev.stdout, dev.stdout + dev.stderr
    ci = _pytest_without_root(suite, DBLP_TESTBED_REQUIRE_EMU="1")
    assert ci.returncode != 0 and "need root" in ci.stdout, ci.stdout + ci.stderr


#: The suite's background call that makes the rehearsal's machine image.
IMAGE_CALL = "-m testbed.emulation.cluster.machines"


def _make_test(tmp_path, unit_rc: int, emu_rc: int, target: str = "test"):
    """`make TARGET`'s suite with a stand-in python that logs each call and exits with a code.

    ``-o`` takes set-up, lint and the test tools as done, so only the suite's
    own recipe runs: the calls it makes, in order, and its exit code.
    """
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "${{DBLP_TESTBED_REQUIRE_EMU:-}}|$*" >> {calls}\n'
                    f'[ -n "${{DBLP_TESTBED_REQUIRE_EMU:-}}" ] && exit {emu_rc}\nexit {unit_rc}\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("CI", "DBLP_TESTBED_REQUIRE_EMU", "MAKEFLAGS", "MAKELEVEL")}
    res = subprocess.run(["make", "--no-print-directory", "-o", "setup", "-o", "lint", "-o", "test-tools",
                          target, f"PY={fake}"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    logged = [line.split("|", 1) for line in calls.read_text().splitlines()] if calls.exists() else []
    # The rehearsal's image is made in the background (its own call, not a pytest one).
    image = [c for c in logged if c[1] == IMAGE_CALL]
    assert len(image) == 1, logged
    return res, [c for c in logged if c[1] != IMAGE_CALL]


@pytest.mark.unit
def test_make_test_runs_the_unit_tests_in_parallel_first_then_the_emulation_tests(tmp_path):
    res, calls = _make_test(tmp_path, 0, 0)
    assert res.returncode == 0, res.stdout + res.stderr
    (unit_env, unit), (emu_env, emu) = calls
    assert unit_env == "" and "-n" in unit.split() and unit.split()[-1] == "tests/unit"
    assert emu_env == "1" and emu.split()[-2:] == ["tests/emu", "tests/e2e"]
    assert "-m not long" in emu
    # one durations file for both parts: the suite's slowest tests come last
    [durations] = {a for a in unit.split() + emu.split() if a.startswith("--suite-durations=")}
    assert durations in unit.split() and durations in emu.split()
    (tmp_path / "all").mkdir()
    res, [(_, unit_all), (_, everything)] = _make_test(tmp_path / "all", 0, 0, "test-all")

    def same(call):  # the call without its (temporary) durations file
        return [a for a in call.split() if not a.startswith("--suite-durations=")]
    assert res.returncode == 0 and same(unit_all) == same(unit)
    assert same(everything) == same(emu.replace("-m not long ", ""))


@pytest.mark.unit
@pytest.mark.parametrize("unit_rc,emu_rc", [(1, 0), (5, 0), (0, 1), (0, 5)])
def test_make_test_fails_when_either_part_fails_or_collects_nothing(tmp_path, unit_rc, emu_rc):
    """pytest's 5 (no test collected) fails the target too; a unit failure still lets the
    emulation part run, so one CI run reports both."""
    res, calls = _make_test(tmp_path, unit_rc, emu_rc)
    assert res.returncode != 0
    assert len(calls) == 2


def _long_tests() -> dict[str, list[str]]:
    """{test file: [test functions marked `long`]}, read from the source."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                    ast.unparse(d) == "pytest.mark.long" for d in node.decorator_list):
                found.setdefault(path.relative_to(ROOT).as_posix(), []).append(node.name)
    return found


@pytest.mark.unit
def test_every_test_only_make_test_all_runs_is_named_in_the_readme():
    """Nothing leaves `make test` silently: each `long` test is in the README's list, by its file
    when the whole file is long, else by its name."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Tests only `make test-all` runs", 1)[1].split("\n#", 1)[0]
    long_tests = _long_tests()
    assert long_tests
    for file, names in long_tests.items():
        assert f"`{file}" in section, file
        tests = [n.name for n in ast.parse((ROOT / file).read_text()).body
                 if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        if tests != names:
            for name in names:
                assert f"`{file}::{name}`" in section, (file, name)


@pytest.mark.unit
def test_the_suite_ends_with_its_slowest_tests_over_both_parts(tmp_path):
    """Two sessions add to one durations file; the second lists the slowest of both."""
    suite = _suite()
    (suite / "test_a.py").write_text("import time\n\ndef test_slow_a():\n    time.sleep(0.3)\n")
    (suite / "test_b.py").write_text("import time\n\ndef test_slower_b():\n    time.sleep(0.6)\n")
    durations = tmp_path / "durations"
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "DBLP_TESTBED_REQUIRE_EMU")}
    outs = [subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            f"--suite-durations={durations}", str(suite / name)], cwd=suite, env=env,
                           capture_output=True, text=True, timeout=120)
            for name in ("test_a.py", "test_b.py")]
    shutil.rmtree(suite, ignore_errors=True)
    assert [o.returncode for o in outs] == [0, 0], outs[1].stdout
    tail = outs[1].stdout.split("slowest tests", 1)[1].splitlines()
    assert "test_b.py::test_slower_b" in tail[1] and "call" in tail[1]
    assert "test_a.py::test_slow_a" in tail[2]
