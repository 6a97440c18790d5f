"""The import structure docs/architecture.md describes, held against the code.

Read from the source (every import, module-level or inside a function, as
Python's own parser sees it), so a circle hidden by a local import counts:
- the layers: ``dblp`` and ``topologies`` at the bottom, then
  ``controllers``, then ``workloads``, then ``testbed``; no module imports
  a layer above its own;
- the analysis reads run directories and references, never the runner:
  nothing under ``testbed/analysis/`` imports ``testbed.run``;
- no two modules import each other, directly or round a loop. A package's
  ``__init__`` is the one exception: it hands its modules' names on, so
  a module importing a name from its own package's face is not a loop;
- inside ``testbed``, the floors of docs/architecture.md: what every room
  shares (errors, output, options), then the spec (``config``), then what
  reads or builds from a spec (run directories, physics, references, the
  fabric, the analysis, the test builders), then the benches, the run, the
  CLI on top; no module imports a floor above its own, and no two rooms
  import each other, even inside a function.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("dblp", "topologies", "controllers", "workloads", "testbed")
LAYER = {"dblp": 0, "topologies": 0, "controllers": 1, "workloads": 2, "testbed": 3}
#: testbed's floors (a module not named here: floor 0, what every room shares).
FLOORS = {"testbed.config": 1, "testbed.rundir": 2, "testbed.physics": 2,
          "testbed.references": 2, "testbed.emulation": 2, "testbed.analysis": 2,
          "testbed.testing": 2, "testbed.bench": 3, "testbed.run": 4, "testbed.cli": 5}


def _floor(module: str) -> int:
    for room in sorted(FLOORS, key=len, reverse=True):
        if module == room or module.startswith(room + "."):
            return FLOORS[room]
    return 0


def _room(module: str) -> str:
    """testbed's room of a module: ``testbed.analysis.claims`` -> ``testbed.analysis``."""
    return ".".join(module.split(".")[:2])


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(name: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The project's modules this one imports (a name imported from a package
    counts as its module when it is one)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_pkg else 0)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def test_the_graph_is_read_from_the_whole_tree(graph):
    # the reader found the project: every package, and real arrows between them
    assert {m.split(".")[0] for m in graph} == set(PACKAGES)
    assert "testbed.rundir" in graph["testbed.analysis.raw"]
    assert sum(len(v) for v in graph.values()) > 200


def test_no_module_imports_a_layer_above_its_own(graph):
    up = sorted((a, b) for a, deps in graph.items() for b in deps
                if LAYER[b.split(".")[0]] > LAYER[a.split(".")[0]])
    assert up == []


def test_the_analysis_never_imports_the_runner(graph):
    bad = sorted((a, b) for a, deps in graph.items() if a.startswith("testbed.analysis")
                 for b in deps if b == "testbed.run" or b.startswith("testbed.run."))
    assert bad == []


def test_no_import_circle(graph):
    faces = {m for m, p in _modules().items() if p.name == "__init__.py"}
    edges = {a: {b for b in deps if b not in faces} for a, deps in graph.items()}
    seen: dict[str, int] = {}   # 1 on the current path, 2 done
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if seen.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in seen:
                visit(nxt, path + [nxt])
        seen[node] = 2

    for start in sorted(edges):
        if start not in seen:
            visit(start, [start])
    assert circles == []


def test_no_module_of_testbed_imports_a_floor_above_its_own(graph):
    inside = {a: {b for b in deps if b.startswith("testbed")}
              for a, deps in graph.items() if a.startswith("testbed")}
    up = sorted((a, b) for a, deps in inside.items() for b in deps if _floor(b) > _floor(a))
    assert up == []
    # the map names rooms that exist
    assert all(any(m == r or m.startswith(r + ".") for m in graph) for r in FLOORS)


def test_no_two_rooms_of_testbed_import_each_other(graph):
    rooms: dict[str, set[str]] = {}
    for a, deps in graph.items():
        for b in deps:
            if a.startswith("testbed.") and b.startswith("testbed.") and _room(a) != _room(b):
                rooms.setdefault(_room(a), set()).add(_room(b))
    both = sorted((a, b) for a in rooms for b in rooms[a] if a < b and a in rooms.get(b, ()))
    assert both == []


def test_a_planted_climb_inside_a_function_is_caught(tmp_path):
    """The reader sees an import a function makes: plant one in a copy of the config room
    that climbs to the run, and the floor test's rule finds it."""
    known = _modules()
    planted = tmp_path / "testbed" / "config" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("def later():\n    from testbed.run import runner\n    return runner\n")
    deps = _imports("testbed.config.planted", planted, {**known, "testbed.config.planted": planted})
    assert "testbed.run.runner" in deps
    assert [d for d in deps if _floor(d) > _floor("testbed.config.planted")] == ["testbed.run.runner"]
