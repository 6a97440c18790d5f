"""The set-up contract: CI calls exactly the README's test command."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.unit
def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^\s+make test\b", readme, re.M), "README must show `make test`"
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")
                and not line.startswith(("set ", "cd "))]
    assert commands == ["exec make test"]
