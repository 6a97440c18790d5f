"""The reviewer VM's Vagrantfile: valid for Vagrant, Debian 12, both providers, same set-up as CI."""
import pathlib
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.unit

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


def _provision_script() -> str:
    m = re.search(r"PROVISION = <<~'SHELL'\n(.*?)\nSHELL\n", VAGRANTFILE.read_text(), re.S)
    assert m, "Vagrantfile must keep its provisioning script in the PROVISION heredoc"
    return "\n".join(line[2:] if line.startswith("  ") else line for line in m.group(1).splitlines())


@pytest.fixture
def vagrant():
    if shutil.which("vagrant") is None:
        pytest.fail("vagrant not installed (./setup.sh installs Debian's vagrant package)")
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


def test_box_providers_and_resources():
    text = VAGRANTFILE.read_text()
    assert 'config.vm.box = "debian/bookworm64"' in text            # Debian 12
    for provider in ("virtualbox", "libvirt"):
        block = re.search(rf'config\.vm\.provider "{provider}" do \|(\w+)\|(.*?)\n  end', text, re.S)
        assert block, f"no {provider} provider block"
        var, body = block.group(1), block.group(2)
        assert f"{var}.cpus = VM_CPUS" in body and f"{var}.memory = VM_MEMORY_MB" in body
    cpus = int(re.search(r'"DBLP_VM_CPUS", "(\d+)"', text).group(1))
    mem = int(re.search(r'"DBLP_VM_MEMORY_MB", "(\d+)"', text).group(1))
    assert cpus >= 4 and mem >= 4096   # k=4: OVS ~1 core, 4 workers + server, torch


def test_provisioning_is_setup_sh_then_the_test_command():
    script = _provision_script()
    lines = [line.strip() for line in script.splitlines()]
    assert "./setup.sh" in lines and "make test" in lines
    assert lines.index("./setup.sh") < lines.index("make test")
    res = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (ROOT / "setup.sh").exists()
    assert re.search(r"^test:", (ROOT / "Makefile").read_text(), re.M), "Makefile has no test target"
