"""A fork server per emulated host: the workers' libraries imported once, every unit forked.

``python -m workloads.forkserver``, started by the harness inside a host's
namespaces with a SOCK_SEQPACKET socket as its standard input. Why: a worker
spends about 2 s of CPU before its first line of training, 1 s importing torch
and 0.9 s importing torch._dynamo (and sympy), which the optimizer's
constructor pulls in; a unit starts three or four such processes at once on
this machine's two cores, and they took 3.3-4.1 s from the unit's start to its
first round. Forked from a process that has done it, they start in a fraction
of that. torch supports a fork after its import (PyTorch's DataLoader
forks its workers from a process that has imported it, and
multiprocessing's forkserver works the same way); the parent here starts no
thread of its own and computes nothing before it forks.

One fork server serves the whole machine: it runs in this machine's own
namespaces, and each child enters its emulated host's network namespace
(``setns``, as Mininet's ``mnexec -a`` does) before anything of it runs, so
torch is imported once per run rather than once per host (five hosts took
7.9 s on two cores, importing side by side), and before the fabric is up.

A request is one JSON message, ``{"module": ..., "argv": [...], "env": {...},
"cwd": ..., "ns_pid": ...}``, with three file descriptors (standard input, output and error);
``ns_pid`` is a process of the host whose namespaces the child joins (None: this machine's);
the answer is ``{"pid": ...}``, or ``{"error": ...}`` for a module that is not
served. When a child ends the server sends ``{"pid": ..., "exit": ...}`` (a
negative number for a signal, as ``subprocess`` says it). The child runs
``module.main(argv)`` with ``env`` as its whole environment and ends with
`workloads.leave.leave`. The server ends when its socket closes.
"""
from __future__ import annotations

import ctypes
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback

from workloads.leave import leave

#: The modules a fork server serves: each has ``main(argv) -> int``.
SERVED = ("workloads.worker", "workloads.server")
#: Bytes of one request or answer (a worker's environment and arguments fit many times).
MESSAGE_BYTES = 1 << 16


def warm() -> None:
    """Import what every served process would import on its own, before any fork."""
    for name in SERVED:
        importlib.import_module(name)
    import torch._dynamo  # noqa: F401  the optimizer's constructor imports it on first use


def serve(ctl: socket.socket) -> None:
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, None)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for key, _ in sel.select():
            if key.data is None:
                msg, fds, _flags, _addr = socket.recv_fds(ctl, MESSAGE_BYTES, 3)
                if not msg:
                    return  # the harness closed its end: the run is over
                answer = _fork(json.loads(msg), fds, ctl, sel, children)
                ctl.send(json.dumps(answer).encode())
            else:
                pidfd = key.fd
                pid = children.pop(pidfd)
                sel.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                ctl.send(json.dumps({"pid": pid, "exit": os.waitstatus_to_exitcode(status)}).encode())


def _fork(req: dict, fds: list[int], ctl: socket.socket, sel: selectors.BaseSelector,
          children: dict[int, int]) -> dict:
    try:
        if req.get("module") not in SERVED or len(fds) != 3:
            return {"error": f"serves only {', '.join(SERVED)}, each with three descriptors; "
                             f"got {req.get('module')!r} with {len(fds)}"}
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sel.close()
            _child(req, fds, ctl, list(children))
        pidfd = os.pidfd_open(pid)
        children[pidfd] = pid
        sel.register(pidfd, selectors.EVENT_READ, pid)
        return {"pid": pid}
    finally:
        for fd in fds:
            os.close(fd)


def _child(req: dict, fds: list[int], ctl: socket.socket, pidfds: list[int]) -> None:
    """In the forked child: its own descriptors, environment and name; then the module."""
    code: int | str | None = 1
    try:
        ctl.close()
        for fd in pidfds:
            os.close(fd)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        if req.get("ns_pid") is not None:
            enter_namespaces(int(req["ns_pid"]))
        os.environ.clear()
        os.environ.update(req["env"])
        if req.get("cwd"):
            os.chdir(req["cwd"])
        _name(req["module"].rsplit(".", 1)[-1] + req["env"].get("RANK", ""))
        code = importlib.import_module(req["module"]).main(list(req["argv"]))
    except SystemExit as exc:  # argparse's errors, SystemExit("message")
        code = exc.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    leave(code)


#: The namespaces a child joins, with ``setns``'s flag for each: the network one always (an
#: emulated host is one), the mount one where the host has its own (Mininet's private dirs).
NAMESPACES = (("net", 0x40000000), ("mnt", 0x00020000))


def enter_namespaces(pid: int) -> None:
    """Join process ``pid``'s network (and, where it differs, mount) namespace, as ``mnexec -a``.

    Called in a freshly forked child, which has one thread: the mount namespace can be
    joined only by a process with one thread, and sockets opened before would stay in
    the old network namespace.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, flag in NAMESPACES:
        path = f"/proc/{pid}/ns/{kind}"
        if os.stat(path).st_ino == os.stat(f"/proc/self/ns/{kind}").st_ino:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.setns(fd, flag) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into {path}: {os.strerror(err)}")
        finally:
            os.close(fd)


def _name(name: str) -> None:
    """The process's name as ps and top show it (15 bytes), instead of the server's."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def main() -> int:
    ctl = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # its own input is the socket's duplicate, not fd 0
    os.close(devnull)
    warm()
    ctl.send(json.dumps({"ready": os.getpid()}).encode())
    serve(ctl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
