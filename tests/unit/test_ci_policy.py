"""`.ci/run` cannot go green by skipping the emulation tests.

A throw-away suite with one ``emu`` test (it touches nothing) runs under the
project's own ``tests/conftest.py`` as a user without root (a plugin makes
``os.geteuid`` say so: the interpreter here is root's): a developer sees it
skipped, ``make test`` (what ``.ci/run`` runs; it sets
``DBLP_TESTBED_REQUIRE_EMU=1``) sees it fail.
"""
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
