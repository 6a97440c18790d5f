"""The fabric's owner on a remote server: it claims the machine, records, and cleans up.

Why an agent: clean-up must not depend on the first server staying alive.
The fabric starts one agent per remote server over ssh
(``python -m testbed.emulation.cluster.agent``) and keeps its stdin open for
the fabric's whole life. The agent

- claims that machine as a fabric does here (`cleanup.claim_machine`: one
  fabric per machine, a second is refused naming the live one), with itself
  as the owner in the state file, so that machine's own ``dblp-testbed
  clean`` knows the fabric is live while the agent runs and dead after;
- adds what the fabric makes there to that state (its bridges and tunnel
  ends by name, its host and switch shells by PID, found as the children of
  the agent's own ssh connection tagged ``mininet:<node>`` with a node the
  fabric placed there);
- runs root-namespace commands the fabric sends it (``tc``, ``nft``, ``ip``)
  without a new ssh connection each;
- when its stdin ends, whether the fabric stopped or its ssh connection died
  (the first server rebooted, the network went), removes exactly what the
  state records (`cleanup.clean`), answers with what it removed, and exits.

The protocol is one JSON object per line each way; every request gets one
reply, ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``:

- ``{"op": "claim", "state": {...}}`` (first): the fabric's id, bridges, links;
- ``{"op": "record", "bridges": [...], "links": [...], "shells": true}``;
- ``{"op": "mkdir", "paths": [...], "under": RUN_DIR}``: folders for the run's files
  there (the run's folder, when the agent made it, goes at ``stop``);
- ``{"op": "run", "argv": [...], "input": "..."}`` -> ``rc``, ``out``, ``err``;
- ``{"op": "envfile", "env": {NAME: VALUE}}`` -> ``path``: the variables a command there
  needs (the job's secret among them) in a file only root reads, which the command
  sources and removes (`ENV_WRAPPER`); ssh's argv, readable by every user in
  ``/proc/PID/cmdline``, never holds them. The folder goes at ``stop``;
- ``{"op": "time"}`` -> ``time_ns``: this machine's clock (the fabric's offset estimate);
- ``{"op": "stop"}`` -> ``removed`` (then the agent exits).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from testbed.emulation import cleanup
from testbed.errors import MachineError

#: The agent's first line: the fabric reads it to know the agent started.
READY = {"ok": True, "agent": "dblp-testbed cluster agent"}
#: A variable name the environment file may set (a shell's own rule, so sourcing it is exact).
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: ``sh -c ENV_WRAPPER FILE ARGV...``: export the file's variables, remove it, run ``ARGV``.
ENV_WRAPPER = 'set -a && . "$0" && set +a && rm -f -- "$0" && exec "$@"'


def env_file_text(env: dict) -> str:
    """``NAME='VALUE'`` lines a POSIX shell sources back to exactly ``env``."""
    lines = []
    for name, value in env.items():
        if not (isinstance(name, str) and ENV_NAME.match(name) and isinstance(value, str)):
            raise ValueError(f"envfile: {name!r} is not a variable name with a string value")
        lines.append(f"{name}={shlex.quote(value)}\n")
    return "".join(lines)


def _shells(state: dict) -> list[tuple[int, str]]:
    """This fabric's Mininet shells here: tagged ``mininet:<node>`` for a node it placed on this
    machine, and started over the agent's own ssh connection.

    Why both: the cluster edition starts each node's shell through an ssh
    session, so they are not the agent's children; but every session of one
    fabric to this server shares one multiplexed connection
    (``nodes.SshPlan``: ``ControlMaster``), whose sshd process on this machine
    is the parent of each session's command, the agent's included. Another
    fabric's or another user's Mininet, over ssh or not, hangs under another
    sshd process (or none), and the node names alone (a fat-tree's are the
    same in every run) could not tell them apart.
    """
    ours = _sshd_of(os.getpid())
    if ours is None:
        return []
    nodes = set(state.get("bridges", [])) | set(state.get("hosts", []))
    out = []
    for pid, cl in cleanup.all_processes():
        tag = cl.rsplit(" ", 1)[-1]
        if tag.startswith("mininet:") and tag[len("mininet:"):] in nodes and "bash" in cl \
                and _sshd_of(pid) == ours:
            out.append((pid, tag))
    return out


def _sshd_of(pid: int) -> int | None:
    """The nearest sshd process above ``pid`` (its ssh connection's, on this machine), if any."""
    for _ in range(4):
        pid = cleanup.parent(pid)
        if pid <= 1:
            return None
        if cleanup.cmdline(pid).startswith("sshd"):
            return pid
    return None


def _netns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _kill_in_hosts(shells: list[dict]) -> None:
    """Stop every process in the network namespaces of the fabric's host shells here.

    Why: a command the first server started in a host (a worker, a capture)
    runs under its own ssh session, not under the host's shell; when that
    server dies, or stops the local ssh client, the command can outlive it.
    Whatever runs in this fabric's hosts' namespaces is this fabric's.
    """
    own = {_netns(r["pid"]) for r in shells if str(r.get("expect", "")).startswith("mininet:")}
    own.discard("")
    own.discard(_netns(os.getpid()))  # never the machine's own namespace
    shell_pids = {r["pid"] for r in shells}
    victims = [pid for pid, _ in cleanup.all_processes()
               if pid not in shell_pids and pid != os.getpid() and _netns(pid) in own]
    cleanup.kill_many([cleanup.record(pid, "") for pid in victims], grace=2.0)


class Agent:
    """One fabric's state on this machine, from ``claim`` to ``stop`` (or the end of stdin)."""

    def __init__(self):
        self.state: dict | None = None
        self.lock: int | None = None

    def claim(self, req: dict) -> dict:
        state = dict(req["state"])
        state.update(pid=os.getpid(), owner=cleanup.owner_record(), processes=[],
                     bridges=list(state.get("bridges", [])), links=list(state.get("links", [])))
        self.lock = cleanup.claim_machine(state)
        self.state = state
        return {}

    def record(self, req: dict) -> dict:
        state = self._state()
        for key in ("bridges", "links"):
            state[key] = sorted(set(state[key]) | set(req.get(key, [])))
        if req.get("shells"):
            known = {r["pid"] for r in state["processes"]}
            state["processes"] += [cleanup.record(pid, tag) for pid, tag in _shells(state)
                                   if pid not in known]
        cleanup.write_state(state["id"], state)
        return {"shells": len(state["processes"])}

    def mkdir(self, req: dict) -> dict:
        """Folders for the run's files, under the run's folder (recorded: they go at ``stop``)."""
        state = self._state()
        under = os.path.realpath(req["under"])
        for path in req["paths"]:
            real = os.path.realpath(path)
            if not real.startswith(under + os.sep) and real != under:
                raise ValueError(f"mkdir: {path} is not under {under}")
            if not os.path.isdir(under):
                state["run_dir_made"] = under
                cleanup.write_state(state["id"], state)
            os.makedirs(real, exist_ok=True)
        return {}

    def envfile(self, req: dict) -> dict:
        """Write the variables of one command into a new 0600 file in the fabric's 0700 folder."""
        state = self._state()
        env = req.get("env")
        if not isinstance(env, dict):
            raise ValueError("envfile: env must be an object of strings")
        text = env_file_text(env)
        folder = os.path.join(cleanup.STATE_DIR, f"env-{state['id']}")
        if state.get("env_dir") != folder:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            os.chmod(folder, 0o700)
            state["env_dir"] = folder
            cleanup.write_state(state["id"], state)
        fd, path = tempfile.mkstemp(prefix="env-", dir=folder)  # 0600 from its creation
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return {"path": path}

    def run(self, req: dict) -> dict:
        argv = req.get("argv")
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise ValueError("run: argv must be a non-empty list of strings")
        p = subprocess.run(argv, input=req.get("input"), capture_output=True, text=True,
                           timeout=float(req.get("timeout", 30)))
        return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}

    def stop(self, _req: dict | None = None) -> dict:
        if self.state is None:
            return {"removed": {}}
        state, self.state = self.state, None
        state["processes"] += [cleanup.record(pid, tag) for pid, tag in _shells(state)
                               if pid not in {r["pid"] for r in state["processes"]}]
        _kill_in_hosts(state["processes"])
        try:
            removed = cleanup.clean(only_state=state)
            if state.get("env_dir"):  # files no command took: they hold the job's secret
                shutil.rmtree(state["env_dir"], ignore_errors=True)
            made = state.get("run_dir_made")
            if made and os.path.isdir(made):  # the run's files were copied to the first server
                shutil.rmtree(made, ignore_errors=True)
                removed["files"].append(made)
        finally:
            cleanup.release_machine(self.lock)
            self.lock = None
        return {"removed": removed}

    def _state(self) -> dict:
        if self.state is None:
            raise ValueError("claim first")
        return self.state

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        handler = {"claim": self.claim, "record": self.record, "mkdir": self.mkdir, "run": self.run,
                   "envfile": self.envfile,
                   "time": lambda _req: {"time_ns": time.time_ns()}, "stop": self.stop}.get(op)
        if handler is None:
            raise ValueError(f"unknown op {op!r}")
        return handler(req)


def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    agent = Agent()

    def _end(_signum, _frame):
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, _end)
    signal.signal(signal.SIGHUP, _end)
    _reply(READY)
    try:
        for line in sys.stdin:
            req: dict = {}
            try:
                req = json.loads(line)
                reply = dict(ok=True, **agent.handle(req))
            except (ValueError, KeyError, TypeError, OSError, MachineError,
                    subprocess.TimeoutExpired) as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            _reply(reply)
            if req.get("op") == "stop" and reply["ok"]:
                return 0
    finally:
        agent.stop()  # stdin ended or a signal came: nothing of the fabric stays
    return 0


if __name__ == "__main__":
    sys.exit(main())
