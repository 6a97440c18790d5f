"""The reviewer VM's Vagrantfile, validated by Vagrant itself.

Vagrant (a Ruby stack) is not in every set-up: `./setup.sh vagrant` installs
it, which `make test` (`./setup.sh vagrant tshark`) and `make vm-check` (just
this file) run first, so the suite never waits for apt.
"""
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
VAGRANTFILE = ROOT / "Vagrantfile"


def _validate(directory: pathlib.Path) -> subprocess.CompletedProcess:
    # --ignore-provider: neither VirtualBox nor libvirt is installed here; the
    # provider blocks are checked textually below. Run in a copy so Vagrant's
    # .vagrant/ state never lands in the checkout.
    return subprocess.run(["vagrant", "validate", "--ignore-provider", "--no-tty"],
                          cwd=directory, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(directory),
                               "VAGRANT_CHECKPOINT_DISABLE": "1"})


@pytest.fixture(scope="module")
def vagrant(optional_tool):
    """Vagrant, which `./setup.sh vagrant` installed before the suite."""
    optional_tool("vagrant", "vagrant")
    return True


def test_vagrantfile_validates(vagrant, tmp_path):
    shutil.copy(VAGRANTFILE, tmp_path / "Vagrantfile")
    res = _validate(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "validated successfully" in res.stdout


def test_broken_vagrantfile_fails_validation(vagrant, tmp_path):
    # Proves the check above can fail: an unknown setting is rejected.
    text = VAGRANTFILE.read_text().replace('config.vm.hostname', 'config.vm.hostnam')
    (tmp_path / "Vagrantfile").write_text(text)
    res = _validate(tmp_path)
    assert res.returncode != 0
    assert "hostnam" in res.stdout + res.stderr
