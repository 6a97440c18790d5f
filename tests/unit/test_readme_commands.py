"""Keep the README and the docs true: every command they show is run by a test.

Each command line in the indented blocks of the README, CHANGELOG.md and every
page under docs/ is mapped to the test that runs it; a command without a test
fails here, and the commands no other test runs are run here (cheaply, with
the flags the page shows). Every relative link between the pages resolves,
and every page under docs/ can be reached from the README.
"""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]
#: Every page a reader can reach from the README.
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]

# Command on a page (first words) -> where it is run.
COVERED = {
    "make run": "test_make_run_is_setup_then_the_default_experiment (below); "
                "`run` itself: tests/e2e/test_run.py, test_ci_regression.py",
    "make test-all": "tests/unit/test_ci_policy.py (its recipe: make test with the long tests)",
    "make test": ".ci/run (CI runs exactly this); tests/unit/test_setup_files.py, tests/e2e/test_setup.py, "
                 "tests/unit/test_ci_policy.py (its two parts, their order and exit codes)",
    "dblp-testbed run examples/udp_average.toml": "tests/e2e/test_command_arm.py (the command "
                                                  "arm beside static, as docs/commands.md shows it)",
    "dblp-testbed run": "tests/e2e/test_run.py, tests/e2e/test_ci_regression.py",
    "dblp-testbed report": "tests/e2e/test_run.py",
    "dblp-testbed compare": "tests/e2e/test_ci_regression.py",
    "DBLP_TEST_SLOWDOWN=1 dblp-testbed run": "tests/e2e/test_ci_regression.py (the one ci run "
                                             "with the slowed twin)",
    "make vm-results": "needs a booted VM (none boots on the build machine): "
                       "tests/unit/test_vagrant.py checks its recipe; `vagrant validate`: "
                       "tests/e2e/test_vagrant_validate.py",
    "make reference": "its two steps: `dblp-testbed run --preset ci` "
                      "(tests/e2e/test_ci_regression.py) and `compare RUN... --update` "
                      "(tests/unit/test_compare.py: five runs, their spread, refusals)",
    "dblp-testbed reproduce": "tests/e2e/test_reproduce.py (a small reference end to end, make test-all; "
                              "--readme-only); the README's tables: tests/unit/test_readme_tables.py",
    "dblp-testbed ablate": "tests/e2e/test_ablate.py (the smoke ablation end to end, resumed; "
                           "make test-all); "
                           "the detector ablation's tables: tests/unit/test_readme_tables.py",
    "dblp-testbed regime": "tests/e2e/test_regime_map.py (the smoke map end to end, resumed; make test-all); "
                           "the reduced map's tables: tests/unit/test_readme_tables.py",
    "dblp-testbed doctor": "tests/emu/test_readme_fabric_commands.py",
    "dblp-testbed net check": "tests/emu/test_fabric_cleanup.py",
    "dblp-testbed net cli": "tests/emu/test_readme_fabric_commands.py",
    "dblp-testbed burst": "tests/emu/test_fabric_bursts.py",
    "dblp-testbed bench transport": "tests/emu/test_dblp_bench.py",
    "dblp-testbed bench collectives": "tests/emu/test_bench_collectives.py",
    "dblp-testbed bench bursts": "tests/emu/test_readme_fabric_commands.py",
    "dblp-testbed sweep": "tests/unit/test_workload_sweep.py",
    "dblp-testbed --version": "tests/unit/test_cli_conventions.py, tests/unit/test_cli_traps.py",
    'eval "$(_DBLP_TESTBED_COMPLETE=bash_source dblp-testbed)"': "tests/unit/test_cli_traps.py "
                                                                  "(the script and a completion)",
    "dblp-testbed clean": "tests/emu/test_fabric_cleanup.py",
    "python -m workloads.loopback": "test_loopback_command (below)",
    ".venv/bin/torchrun": "test_torchrun_ddp_command (below); the comparison with gloo: "
                          "tests/unit/test_dblp_torch_backend.py",
    # The Notebooks block, run line by line on a built run directory:
    "from testbed.analysis import load_run": "tests/unit/test_notebooks.py",
    "run = load_run(": "tests/unit/test_notebooks.py",
    "run.rounds": "tests/unit/test_notebooks.py",
    "run.packets": "tests/unit/test_notebooks.py",
    "run.bottleneck": "tests/unit/test_notebooks.py",
    "run.queue": "tests/unit/test_notebooks.py",
    "ref = load_run(": "tests/unit/test_notebooks.py (the committed default reference)",
    "ref.rounds": "tests/unit/test_notebooks.py",
    ".venv/bin/pytest": "make test runs every file named",
    "group = dblp.TransportGroup.from_env": "tests/unit/test_dblp_loopback.py",
    "stats = group.allreduce_": "tests/unit/test_dblp_loopback.py",
    "python -m dblp.wireshark": "test_wireshark_command (below); its output loaded by "
                                "tests/e2e/test_wireshark_dissector.py",
    "tshark -X lua_script:dblp.lua": "tests/e2e/test_wireshark_dissector.py",
    "dblp-testbed wireshark --install": "tests/unit/test_wireshark_install.py",
}


def page_commands(page: pathlib.Path) -> list[str]:
    text = page.read_text()
    cmds = [line.strip() for line in text.splitlines() if line.startswith("    ") and line.strip()
            and not line.strip().startswith(("|", "#"))
            and not line.split()[0].endswith("/")]  # the Layout block lists folders
    cmds += re.findall(r"`(\.venv/bin/pytest[^`]*)`", text)
    return cmds


def readme_commands() -> list[str]:
    """The commands of every page (README, CHANGELOG.md, docs/)."""
    return [c for page in PAGES for c in page_commands(page)]


@pytest.mark.unit
def test_the_pages_show_commands_from_every_part():
    """The commands moved out of the README are still found where they now are."""
    where = {p.relative_to(ROOT).as_posix(): page_commands(p) for p in PAGES}
    assert any(c.startswith("make run") for c in where["README.md"])
    assert any(c.startswith(".venv/bin/torchrun") for c in where["docs/transport.md"])
    assert any(c.startswith("python -m workloads.loopback") for c in where["docs/workloads.md"])
    assert any(c.startswith("run = load_run(") for c in where["docs/outputs.md"])
    assert any(c.startswith(".venv/bin/pytest") for c in where["docs/reliability.md"])


LINK_RE = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(page: pathlib.Path) -> list[tuple[pathlib.Path, str]]:
    out = []
    for target in LINK_RE.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        out.append(((page.parent / path).resolve() if path else page, anchor))
    return out


@pytest.mark.unit
def test_every_relative_link_resolves():
    for page in PAGES:
        for target, anchor in _links(page):
            assert target.exists(), f"{page.relative_to(ROOT)}: {target} does not exist"
            if anchor:
                headings = [_anchor(h) for h in re.findall(r"^#+ (.*)$", target.read_text(), re.M)]
                assert anchor in headings, f"{page.relative_to(ROOT)}: no heading #{anchor} in {target.name}"


@pytest.mark.unit
def test_every_page_is_reached_from_the_readme():
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md":
            continue
        seen.add(page)
        todo += [t for t, _ in _links(page) if t.is_file()]
    assert {p.resolve() for p in PAGES} <= seen


@pytest.mark.unit
def test_every_readme_command_has_a_test():
    missing = [c for c in readme_commands()
               if not any(c.startswith(prefix) for prefix in COVERED)]
    assert missing == []


@pytest.mark.unit
def test_readme_pytest_paths_exist():
    for cmd in readme_commands():
        if cmd.startswith(".venv/bin/pytest"):
            for arg in cmd.split()[1:]:
                if arg.startswith("tests/"):
                    assert (ROOT / arg).exists(), arg


@pytest.mark.unit
def test_make_run_is_setup_then_the_default_experiment():
    out = subprocess.run(["make", "--no-print-directory", "-n", "run"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0
    assert [line.strip() for line in out.stdout.splitlines()] == ["./setup.sh",
                                                             ".venv/bin/dblp-testbed run"]


@pytest.mark.unit
def test_torchrun_ddp_command():
    """The README's torchrun line, as shown: DDP over the dblp backend and nothing else."""
    import json
    import os
    [cmd] = [c for c in readme_commands() if c.startswith(".venv/bin/torchrun")]
    argv = [sys.executable, "-m", "torch.distributed.run", *cmd.split()[1:]]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads([x for x in out.stdout.splitlines() if x.startswith("{")][-1])
    assert summary["backend"] == "dblp" and summary["world_size"] == 3
    assert summary["replicas_identical"] is True
    assert len(summary["bucket_sizes_bytes"]) >= 2


@pytest.mark.unit
def test_loopback_command(tmp_path):
    out = subprocess.run([sys.executable, "-m", "workloads.loopback", "--arms", "local,reliable",
                          "--rounds", "4", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "raw" / "reliable" / "seed-0" / "server.jsonl").exists()


@pytest.mark.unit
def test_wireshark_command(tmp_path):
    from dblp.wireshark import lua_dissector
    cmd = next(c for c in readme_commands() if c.startswith("python -m dblp.wireshark"))
    assert cmd == "python -m dblp.wireshark > dblp.lua"
    with open(tmp_path / "dblp.lua", "w") as fh:  # the README's "> dblp.lua"
        out = subprocess.run([sys.executable, "-m", "dblp.wireshark"], cwd=tmp_path, stdout=fh,
                             stderr=subprocess.PIPE, text=True, timeout=60,
                             env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "dblp.lua").read_text() == lua_dissector()
