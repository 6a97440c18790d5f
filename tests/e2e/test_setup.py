"""The README's set-up, run again on a prepared machine. It needs root (it may
install Debian packages and start Open vSwitch), so it is no unit test."""
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_setup_is_idempotent_when_everything_is_present():
    """A second set-up on a prepared machine installs nothing."""
    out = subprocess.run(["bash", str(ROOT / "setup.sh")], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "installing" not in out.stderr, out.stderr
    assert "ready" in out.stderr
