"""`dblp-testbed wireshark`: the dissector on stdout, in a file, or installed where tshark loads it."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from dblp.wireshark import lua_dissector

pytestmark = pytest.mark.unit
ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "testbed.cli"]


def _cli(args, home):
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def _tshark():
    path = shutil.which("tshark")
    if path is None and os.environ.get("CI") == "true":
        pytest.fail("tshark missing in CI: ./setup.sh tshark installs it before the suite")
    if path is None:
        pytest.skip("tshark not installed (./setup.sh tshark)")
    return path


def test_stdout_and_file_hold_the_generated_dissector(tmp_path):
    out = _cli(["wireshark"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == lua_dissector()
    target = tmp_path / "d.lua"
    out = _cli(["wireshark", "-o", str(target)], tmp_path)
    assert out.returncode == 0, out.stderr
    assert target.read_text() == lua_dissector()


def test_install_puts_it_where_tshark_loads_it(tmp_path):
    tshark = _tshark()
    env = {**os.environ, "HOME": str(tmp_path)}
    before = subprocess.run([tshark, "-G", "protocols"], capture_output=True, text=True,
                            timeout=120, env=env).stdout
    assert "\tdblp\t" not in before + "\n"      # a fresh home: no DBLP yet
    out = _cli(["wireshark", "--install"], tmp_path)
    assert out.returncode == 0, out.stderr
    installed = next(tmp_path.rglob("dblp.lua"))
    assert installed.read_text() == lua_dissector()
    assert str(installed) in out.stdout
    after = subprocess.run([tshark, "-G", "protocols"], capture_output=True, text=True,
                           timeout=120, env=env).stdout
    assert any(line.split("\t")[-1] == "dblp" for line in after.splitlines())


def test_install_and_out_together_is_one_line_of_error(tmp_path):
    out = _cli(["wireshark", "--install", "-o", str(tmp_path / "x.lua")], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "dblp-testbed: error: wireshark: give --install or --out, not both"]
    assert not (tmp_path / "x.lua").exists()
