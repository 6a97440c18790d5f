"""A run's fork server: its workers and servers forked on their hosts from a warm process.

One ``workloads.forkserver`` for the whole machine, started in this machine's
own namespaces before the fabric is built, so its imports (torch and the
rest, about 2.5 s of CPU) overlap the fabric's start-up, and ready before the
first unit starts. Each child it forks joins its host's network namespace
(`workloads.forkserver.enter_namespaces`) before anything of it runs. A
unit's built-in workers and server are forked there instead of started as
new interpreters: its processes begin training about 2 s of CPU each sooner
(`workloads.forkserver` says why), and torch is imported once per run, not
once per host (one server per host took 7.9 s for five hosts on two cores).
Hosts on other machines (the cluster edition) and users' commands start as
before, with the host's ``popen``.

A forked process is supervised as a started one is (`Forked` answers what
``subprocess.Popen`` answers ``testbed.run.processes``): stopped by its PID,
its exit status as its fork server reaped it. It stays in its fork server's
process group, which the fabric records once the fabric is up (`attach`) and
ends on teardown or clean-up, so nothing it forked outlives the run.
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from testbed.errors import ExperimentFailed

#: How long a fork server may take to import what it serves (seconds); CPU-bound, on a busy
#: two-core machine several start at once.
READY_TIMEOUT_S = 120.0
#: How long a fork may take to be answered (seconds).
FORK_TIMEOUT_S = 30.0
MESSAGE_BYTES = 1 << 16


class ForkServerError(ExperimentFailed):
    """A fork server did not start, or stopped answering (the run fails; its logs stay)."""


class Forked:
    """A process a fork server forked, as the supervision sees a ``subprocess.Popen``."""

    def __init__(self, pid: int, server: ForkServer, args: Sequence[str]):
        self.pid = pid
        self.args = list(args)
        self._server = server
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        code = self._server.wait_exit(self.pid, deadline)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.returncode = code
        return code


class ForkServer:
    """One host's fork server: started with the host's ``popen``, answers on a socket."""

    def __init__(self, name: str, popen: Callable[..., subprocess.Popen], log_path: pathlib.Path,
                 env: dict):
        self.name = name
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab", buffering=0) as log:
            try:
                self.proc = popen([sys.executable, "-m", "workloads.forkserver"],
                                  stdin=theirs.fileno(), stdout=log, stderr=subprocess.STDOUT,
                                  env=env)
            finally:
                theirs.close()
        self._log = log_path
        self._cond = threading.Condition()
        self._answers: list[dict] = []
        self._exits: dict[int, int] = {}
        self._ready = False
        self._gone = False
        self._lock = threading.Lock()  # one request at a time, answered in order
        self._reader = threading.Thread(target=self._read, name=f"forkserver-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                msg = self._sock.recv(MESSAGE_BYTES)
            except OSError:
                msg = b""
            with self._cond:
                if not msg:
                    self._gone = True
                    self._cond.notify_all()
                    return
                m = json.loads(msg)
                if "ready" in m:
                    self._ready = True
                elif "exit" in m:
                    self._exits[int(m["pid"])] = int(m["exit"])
                else:
                    if "pid" in m:  # a new child: an old one's status under a reused PID goes
                        self._exits.pop(int(m["pid"]), None)
                    self._answers.append(m)
                self._cond.notify_all()

    def wait_ready(self, deadline: float) -> None:
        with self._cond:
            while not (self._ready or self._gone) and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            if not self._ready:
                why = "exited" if self._gone else "did not finish importing in time"
                raise ForkServerError(f"the fork server on {self.name} {why}; see {self._log}")

    def popen(self, argv: Sequence[str], *, stdout, stderr=None, stdin=None, env: dict | None = None,
              cwd=None, ns_pid: int | None = None, **_ignored) -> Forked:
        """Fork ``python -m MODULE ARGS...`` (``argv``) as ``subprocess.Popen`` would start it,
        in the namespaces of process ``ns_pid`` (an emulated host's shell; None: the server's)."""
        argv = [os.fspath(a) for a in argv]
        if len(argv) < 3 or argv[1] != "-m":
            raise ValueError(f"a fork server runs `python -m MODULE ...`, not {argv[:3]}")
        out = stdout.fileno()
        err = out if stderr in (None, subprocess.STDOUT) else stderr.fileno()
        null = os.open(os.devnull, os.O_RDONLY)
        req = {"module": argv[2], "argv": argv[3:], "env": dict(os.environ if env is None else env),
               "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(), "ns_pid": ns_pid}
        try:
            with self._lock:
                try:
                    socket.send_fds(self._sock, [json.dumps(req).encode()], [null, out, err])
                except OSError as exc:
                    raise ForkServerError(f"the fork server on {self.name} is gone ({exc}); "
                                          f"see {self._log}") from None
                answer = self._next_answer(time.monotonic() + FORK_TIMEOUT_S)
        finally:
            os.close(null)
        if "error" in answer:
            raise ForkServerError(f"the fork server on {self.name}: {answer['error']}")
        return Forked(int(answer["pid"]), self, argv)

    def _next_answer(self, deadline: float) -> dict:
        with self._cond:
            while not self._answers and not self._gone and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            if not self._answers:
                raise ForkServerError(f"the fork server on {self.name} did not answer; "
                                      f"see {self._log}")
            return self._answers.pop(0)

    def exit_status(self, pid: int) -> int | None:
        """``pid``'s exit status; None while it runs. A fork server that went away cannot say
        how its running children end: -1 once the child is gone too."""
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
            if self._gone and not _alive(pid):
                return -1
        return None

    def hang_up(self) -> None:
        """Close our end of its socket, which tells it to exit (`close` then waits for it)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def wait_exit(self, pid: int, deadline: float | None) -> int | None:
        with self._cond:
            while True:
                code = self.exit_status(pid)
                if code is not None:
                    return code
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                # A fork server that is gone sends nothing more: look again now and then.
                self._cond.wait(0.05 if self._gone else left)

    def close(self, timeout: float = 5.0) -> None:
        """End the fork server: its socket closed, it exits; a server that hangs, or is still
        importing (an interrupted start: it reads its socket only when ready), is killed."""
        self.hang_up()
        try:
            self.proc.wait(timeout=timeout if self._ready else 0.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=1.0)
        self._sock.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ForkServers:
    """The run's fork server, shared by the hosts of this machine that hold a role.

    Two steps, so that its imports overlap the fabric's start-up: made before the
    fabric is built, then attached to it (`attach`) once it is up.
    """

    #: Where its output goes, under the run directory.
    LOG = pathlib.Path("raw") / "forkserver.out"

    def __init__(self, run_dir: pathlib.Path, env: dict):
        self.server = ForkServer("this machine",
                                 lambda argv, **kw: subprocess.Popen(argv, start_new_session=True, **kw),
                                 run_dir / self.LOG, env)
        self.fab = None
        self.hosts: list[str] = []

    def attach(self, fab, hosts: Sequence[str]) -> None:
        """Serve ``hosts`` of ``fab`` (those on this machine), the server ready.

        The fabric records the server's process group, which its teardown and
        ``dblp-testbed clean`` end, as it does for what it starts itself."""
        self.fab = fab
        self.hosts = [h for h in dict.fromkeys(hosts) if fab.server_of(h) == "local"]
        fab.adopt(self.server.proc, "workloads.forkserver")
        self.server.wait_ready(time.monotonic() + READY_TIMEOUT_S)

    def popen_for(self, host: str) -> Callable[..., subprocess.Popen | Forked]:
        """How to start a built-in worker or server on ``host``."""
        if host not in self.hosts:
            return lambda argv, **kw: self.fab.popen(host, argv, **kw)
        pid = self.fab.host(host).pid
        return lambda argv, **kw: self.server.popen(argv, ns_pid=pid, **kw)

    def close(self) -> None:
        self.server.close()
