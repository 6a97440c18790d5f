"""No subprocess is started through a shell anywhere in the project.

Specs carry user-chosen names and targets; they may only ever reach a child
process as separate argv items. This scans the source for every way Python
(or Mininet) can hand a string to /bin/sh.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ["dblp", "topologies", "controllers", "workloads", "testbed"]
SHELL_CALLS = {"system", "popen", "getoutput", "getstatusoutput",  # os.*, subprocess.*
               "cmd", "sendCmd", "quietRun", "errRun", "cmdPrint"}  # Mininet's shell helpers


def _sources():
    for pkg in PACKAGES:
        yield from sorted((ROOT / pkg).rglob("*.py"))


@pytest.mark.unit
def test_no_shell_true_and_no_shell_helpers():
    offenders = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant)
                                              and kw.value.value is False):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} shell=")
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in SHELL_CALLS:
                base = f.value.id if isinstance(f.value, ast.Name) else ""
                if f.attr in ("popen", "system", "getoutput", "getstatusoutput") and \
                        base not in ("os", "subprocess", "commands"):
                    continue  # e.g. Fabric.popen(host, argv): list argv, no shell
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {base}.{f.attr}")
    assert offenders == []


@pytest.mark.unit
def test_the_scan_sees_the_project():
    assert sum(1 for _ in _sources()) > 30
