"""Installable as a package: every third-party import declared, the SPDX licence form.

Why read the imports: scipy was imported by the analysis and declared
nowhere, so a `pip install .` without constraints.txt (which pins it only
because the venv happened to hold it) gave an analysis that failed at its
first interval.
"""
from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("dblp", "topologies", "controllers", "workloads", "testbed")
#: Imported and deliberately not declared, each with its reason.
UNDECLARED = {
    "mininet": "Debian's mininet package, with the mnexec it drives (setup.sh links it in)",
    "ryu": "controllers/compat.py's fallback where os-ken is missing; os-ken is declared",
}


def _imports(paths) -> dict[str, set[str]]:
    """Top-level third-party module -> the files that import it."""
    out: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in PACKAGES:
                    out.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return out


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _distributions(module: str) -> set[str]:
    return {d.lower().replace("_", "-")
            for d in importlib.metadata.packages_distributions().get(module, [])}


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_imported_third_party_package_is_declared(project):
    declared = {_name(r) for r in project["dependencies"]}
    imports = _imports(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    assert "scipy" in imports and "numpy" in imports  # the reader found the imports
    missing = {m: sorted(files) for m, files in imports.items()
               if m not in UNDECLARED and not _distributions(m) & declared}
    assert missing == {}


def test_the_tests_imports_are_declared_with_the_test_extra(project):
    declared = {_name(r) for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]}
    local = {p.stem for p in (ROOT / "tests").rglob("*.py")} | {"conftest"}
    imports = _imports((ROOT / "tests").rglob("*.py"))
    missing = {m: sorted(files) for m, files in imports.items()
               if m not in UNDECLARED and m not in local and not _distributions(m) & declared}
    assert missing == {}


def test_the_licence_is_an_spdx_expression_the_build_backend_reads(project):
    """``license = {text = ...}`` draws setuptools' deprecation warning at every install."""
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    assert "setuptools>=77" in build["requires"]  # the first setuptools that reads that form
    installed = importlib.metadata.version("setuptools")
    assert tuple(int(x) for x in installed.split(".")[:2]) >= (77, 0)
