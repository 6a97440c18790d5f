"""Process supervision: every process the harness starts is tracked by PID.

Processes are started from argument lists (never through a shell, so nothing
from a spec is ever interpreted by one), each with its own log file, and
stopped by PID: SIGTERM first, SIGKILL after a grace period. Nothing is
killed by name, so nothing outside the run can be touched.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Callable, Sequence


@dataclasses.dataclass
class Supervised:
    """One started process, its role and where its output goes."""

    name: str
    proc: subprocess.Popen
    log_path: pathlib.Path
    critical: bool = True  # its failure ends the arm

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self):
        return self.proc.poll()

    def tail(self, lines: int = 8) -> str:
        """The last lines of its output: what a failure report should show."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        keep = [line for line in text.splitlines() if line.strip()][-lines:]
        return "\n".join(keep)


class ProcessGroup:
    """Processes of one arm (or of the run), stopped together, by PID."""

    def __init__(self):
        self.members: list[Supervised] = []

    def start(self, name: str, argv: Sequence[str], log_path: pathlib.Path, *,
              popen: Callable[..., subprocess.Popen] = subprocess.Popen,
              env: dict | None = None, critical: bool = True, cwd=None) -> Supervised:
        """Start `argv` (a list: no shell) via `popen`, e.g. a Mininet host's."""
        if isinstance(argv, str):
            raise TypeError("argv must be a list of arguments, never a shell string")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab", buffering=0)
        try:
            proc = popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, env=env, cwd=cwd)
        finally:
            log.close()  # the child holds its own descriptor
        member = Supervised(name, proc, log_path, critical)
        self.members.append(member)
        return member

    def failed(self) -> list[Supervised]:
        """Critical members that exited non-zero."""
        return [m for m in self.members if m.critical and m.poll() not in (None, 0)]

    def returncode(self, name: str) -> int | None:
        """The exit status of the member called ``name``; None while it runs (or is unknown)."""
        return next((m.poll() for m in self.members if m.name == name), None)

    def running(self) -> list[Supervised]:
        return [m for m in self.members if m.poll() is None]

    def wait(self, names: Sequence[str], timeout: float) -> bool:
        """Wait until the named members exit; False on timeout."""
        deadline = time.monotonic() + timeout
        for m in self.members:
            if m.name in names:
                left = deadline - time.monotonic()
                try:
                    m.proc.wait(timeout=max(left, 0.01))
                except subprocess.TimeoutExpired:
                    return False
        return True

    def stop(self, grace: float = 3.0, sig: int = signal.SIGTERM):
        """SIGTERM every running member, SIGKILL what is left after `grace`."""
        for m in self.running():
            _signal(m.pid, sig)
        deadline = time.monotonic() + grace
        for m in self.members:
            left = deadline - time.monotonic()
            try:
                m.proc.wait(timeout=max(left, 0.01))
            except subprocess.TimeoutExpired:
                _signal(m.pid, signal.SIGKILL)
                try:
                    m.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass


def _signal(pid: int, sig: int):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
