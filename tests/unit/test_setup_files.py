"""The set-up contract: CI calls exactly the README's test command; the venv is the locked set."""
import os
import pathlib
import re
import subprocess
import sys

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


def _pins(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.strip()
        if line and not line.startswith(("#", "-e")) and "==" in line:
            name, version = line.split("==", 1)
            out[name.lower().replace("_", "-")] = version
    return out


def test_the_venv_holds_exactly_the_locked_versions():
    """What setup.sh installed is what constraints.txt pins: nothing unpinned, nothing drifted."""
    locked = _pins((ROOT / "constraints.txt").read_text().splitlines())
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    installed = _pins(freeze)
    assert "torch" in locked and "mininet" not in locked
    unpinned = sorted(set(installed) - set(locked))
    # A lock without a build label (torch==2.13.0) holds any build of it (2.13.0+cpu), as pip's
    # own == does: which build is setup.sh's choice (testbed/install.py).
    drifted = {n: (v, locked[n]) for n, v in installed.items()
               if n in locked and locked[n] != (v if "+" in locked[n] else v.split("+")[0])}
    assert unpinned == [] and drifted == {}, (unpinned, drifted)


def test_mininet_comes_from_debian_with_its_mnexec():
    import mininet
    assert pathlib.Path(mininet.__file__).resolve().is_relative_to("/usr/lib/python3/dist-packages")


def test_make_lock_rewrites_constraints_from_the_venv():
    out = subprocess.run(["make", "--no-print-directory", "-n", "lock"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0 and "pip freeze --exclude-editable" in out.stdout
    assert "> constraints.txt" in out.stdout


def test_the_manifest_records_every_python_and_debian_package():
    from testbed.rundir import describe_environment
    env = describe_environment()
    locked = _pins((ROOT / "constraints.txt").read_text().splitlines())
    recorded = {n.lower().replace("_", "-"): v for n, v in env["python_packages"].items()}
    assert all(recorded.get(n) == v for n, v in _pins(
        subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                       capture_output=True, text=True, check=True).stdout.splitlines()).items())
    assert recorded["torch"].split("+")[0] == locked["torch"]
    assert env["debian_packages"]["mininet"] and env["debian_packages"]["openvswitch-switch"]


def test_make_unit_and_lint_need_no_root():
    """`make unit` and `make lint` set up with ``--no-ovs``: as a user who is not root
    (uid nobody, on an environment root already built) setup.sh checks the Debian
    packages and the environment, and never reaches Open vSwitch, which needs root."""
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^unit: venv$", make, re.M) and re.search(r"^lint: venv$", make, re.M)
    assert re.search(r"^venv:\n\t\./setup\.sh --no-ovs$", make, re.M)
    stamp = ROOT / ".venv" / ".dblp-setup-stamp"
    if os.geteuid() != 0 or not stamp.is_file():
        pytest.skip("needs root to become nobody, and a built environment")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp"}
    want = subprocess.run(["bash", "-c", "cat pyproject.toml setup.py dblp/_fastpath.c setup.sh "
                           "constraints.txt | sha256sum | cut -d' ' -f1"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    if stamp.read_text().strip() != want:
        pytest.skip("the environment predates this checkout's set-up files (./setup.sh rebuilds it)")
    if subprocess.run([*as_nobody, "test", "-r", str(ROOT / "setup.sh")], env=env).returncode:
        pytest.skip(f"nobody cannot read {ROOT} (a checkout under a private home)")
    done = subprocess.run([*as_nobody, "bash", "setup.sh", "--no-ovs"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Open vSwitch" not in done.stderr and "ready" in done.stderr
