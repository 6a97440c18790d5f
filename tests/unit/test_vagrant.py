"""The reviewer VM's Vagrantfile: Debian 12, both providers, the same set-up as CI.

Vagrant itself validates it in tests/e2e/test_vagrant_validate.py."""
import pathlib
import re
import subprocess

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
VAGRANTFILE = ROOT / "Vagrantfile"


def _provision_script() -> str:
    m = re.search(r"PROVISION = <<~'SHELL'\n(.*?)\nSHELL\n", VAGRANTFILE.read_text(), re.S)
    assert m, "Vagrantfile must keep its provisioning script in the PROVISION heredoc"
    return "\n".join(line[2:] if line.startswith("  ") else line for line in m.group(1).splitlines())


def test_box_providers_and_resources():
    text = VAGRANTFILE.read_text()
    assert 'config.vm.box = "debian/bookworm64"' in text            # Debian 12
    assert re.search(r'config\.vm\.box_version = "12\.\d{8}\.\d+"', text)   # pinned
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


def test_results_come_back_from_the_vm():
    """The synced folder goes only into the VM: `make vm-results` copies results/ back
    (over the VM's own ssh config; no VM boots here, so its recipe is checked as shell)."""
    make = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^vm-results:\n((?:\t.*\n)+)", make, re.M)
    assert recipe, "Makefile has no vm-results target"
    lines = [x.strip() for x in recipe.group(1).splitlines()]
    assert lines[1] == "vagrant ssh-config > .vagrant/ssh-config"
    assert lines[2].startswith("rsync -a") and lines[2].endswith("default:/vagrant/results/ results/")
    res = subprocess.run(["bash", "-n"], input="\n".join(lines), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
