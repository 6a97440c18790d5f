"""Which torch ./setup.sh installs, on both kinds of index (testbed/install.py).

PyTorch's CPU index lists ``torch-2.13.0+cpu-...`` wheels; the public index
lists ``torch-2.13.0-...``. Both are laid out here as PEP 503 pages under
``file://`` directories, the way pip reads them, and the resolution runs
on each for x86-64 and aarch64, with the CPU index reachable or not.
"""
import json
import pathlib
import subprocess
import sys

import pytest

from testbed import install

pytestmark = pytest.mark.unit
ROOT = pathlib.Path(__file__).resolve().parents[2]
V = "2.13.0"
CPU_WHEELS = [f"torch-{V}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
              f"torch-{V}+cpu-cp311-cp311-manylinux_2_28_aarch64.whl",
              f"torch-{V}+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",
              "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
              f"torch-{V}+cpu-cp311-cp311-win_amd64.whl"]
PUBLIC_WHEELS = [f"torch-{V}-cp311-cp311-manylinux_2_28_x86_64.whl",
                 f"torch-{V}-cp311-cp311-manylinux_2_28_aarch64.whl",
                 f"torch-{V}-cp311-none-macosx_11_0_arm64.whl",
                 "torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl"]


def _index(root: pathlib.Path, wheels: list[str]) -> str:
    """A PEP 503 index with one project page, torch's, as pip reads it."""
    page = root / "torch"
    page.mkdir(parents=True)
    links = "\n".join(f'<a href="../../files/{w}#sha256=00">{w}</a><br/>' for w in wheels)
    (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}\n</body></html>\n")
    return root.as_uri()


@pytest.fixture
def indexes(tmp_path):
    return _index(tmp_path / "cpu", CPU_WHEELS), _index(tmp_path / "public", PUBLIC_WHEELS)


def test_the_pages_are_read_as_pip_reads_them(indexes, tmp_path):
    cpu, public = indexes
    assert install.listing(cpu) == CPU_WHEELS and install.listing(public) == PUBLIC_WHEELS
    assert install.listing((tmp_path / "nothing").as_uri()) is None
    assert install.listing("http://127.0.0.1:9/simple") is None      # nothing listens there
    # A plain directory of wheels (pip's --find-links form) reads too.
    flat = tmp_path / "flat" / "torch"
    flat.mkdir(parents=True)
    (flat / CPU_WHEELS[0]).write_bytes(b"")
    assert install.listing((tmp_path / "flat").as_uri()) == [CPU_WHEELS[0]]


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_cpu_build_where_its_index_is_reachable(arch):
    got = install.resolve(V, CPU_WHEELS, PUBLIC_WHEELS, "cp311", arch)
    assert got["requirement"] == f"torch=={V}+cpu" and got["source"] == "cpu-index"
    assert "CPU build" in got["why"]


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_public_build_of_the_same_version_otherwise(arch):
    got = install.resolve(V, None, PUBLIC_WHEELS, "cp311", arch)
    assert got["requirement"] == f"torch=={V}" and got["source"] == "public"
    assert "unreachable" in got["why"]
    assert ("CUDA" in got["why"]) == (arch == "x86_64")
    # A CPU index without a wheel for this machine counts as none.
    got = install.resolve(V, CPU_WHEELS[3:], PUBLIC_WHEELS, "cp311", arch)
    assert got["requirement"] == f"torch=={V}" and got["source"] == "public"
    assert f"has no {V} wheel for cp311 {arch}" in got["why"]


def test_no_wheel_anywhere_is_one_line_naming_what_is_missing():
    with pytest.raises(ValueError, match="no torch 2.13.0 wheel for cp311 on riscv64"):
        install.resolve(V, CPU_WHEELS, PUBLIC_WHEELS, "cp311", "riscv64")


def test_setup_sh_asks_it_and_gets_pip_arguments(indexes, tmp_path):
    """The command line setup.sh runs: one JSON object whose pip_args it passes to pip."""
    cpu, public = indexes

    def ask(*extra):
        res = subprocess.run([sys.executable, str(ROOT / "testbed" / "install.py"), "--version", V,
                              "--python-tag", "cp311", "--arch", "x86_64", *extra],
                             capture_output=True, text=True, timeout=60)
        return res
    res = ask("--cpu-index", cpu, "--public-index", public)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["pip_args"] == [f"torch=={V}+cpu", "--extra-index-url", cpu]
    res = ask("--cpu-index", (tmp_path / "down").as_uri(), "--public-index", public)
    assert json.loads(res.stdout)["pip_args"] == [f"torch=={V}"]
    res = ask("--cpu-index", (tmp_path / "down").as_uri(), "--public-index",
              (tmp_path / "down").as_uri())
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("setup: no torch 2.13.0 wheel") and res.stderr.count("\n") == 1


def test_the_lock_names_torch_without_a_build_label():
    """constraints.txt pins the version; the build (+cpu or not) is setup.sh's choice."""
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.startswith("torch==")]
    assert pins == [f"torch=={V}"]
    setup = (ROOT / "setup.sh").read_text()
    assert "testbed/install.py --version" in setup and "download.pytorch.org" not in setup
