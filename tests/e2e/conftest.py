"""End-to-end tests: whatever a failing test leaves behind must not fail the next one."""
import subprocess
import sys

import pytest

from testbed import REPO_ROOT


@pytest.fixture(autouse=True)
def _isolated():
    """After every end-to-end test, the project's own clean-up (only what it created)."""
    yield
    subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], cwd=REPO_ROOT,
                   capture_output=True, timeout=120)
