"""Before a fabric spans machines: is every server reachable, set up, at our revision, with OVS?

Why a preflight: a run that finds a bad server only while building the
fabric has already started switches and tunnels on the good ones, and its
error comes from deep inside ssh or Mininet. Here every server is asked
once, all at the same time, over one ssh connection each with ``BatchMode``
(no password prompt) and a bounded connect, so a spec naming a dead or
unprepared machine is refused within seconds by one line that names the
server and what is missing.

What is asked of a server, in order (the first missing piece is reported):
``unreachable`` (ssh fails; its own message is quoted), ``no root`` (Mininet
needs root: the ssh user is root or has password-less sudo), ``no project
set-up`` (``./setup.sh`` has not finished in the project's folder, which is
the same path as here, as Mininet's cluster edition assumes for its tools),
``other version`` (another git revision than this machine's), ``OVS not
running``, and too few ssh sessions per connection for the nodes placed
there (sshd's ``MaxSessions``). Then, once every server is ready, for every ordered pair of
servers, whether the first reaches the second's address (one ping), since
their tunnels run between them.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from testbed import REPO_ROOT
from testbed.config.servers import Server, check_ssh_options, parse_servers
from testbed.emulation.capabilities import ovs_running
from testbed.errors import MachineError

#: Seconds ssh may take to connect (and finish its handshake) to one server.
CONNECT_TIMEOUT_S = 5.0
#: Seconds the probe may run once connected (ovs-vsctl's own timeout is 3 s).
PROBE_TIMEOUT_S = 15.0
#: The set-up's mark: ``setup.sh`` writes it last, after the venv is complete.
SETUP_STAMP = ".venv/.dblp-setup-stamp"
SETUP_SCRIPT = ".venv/bin/dblp-testbed"

# One POSIX sh script, run on the server as ``sh -c PROBE probe DIR SCRIPT STAMP``
# (`probe_words`): prints KEY=VALUE lines and nothing else, so the answer is
# parsed, never guessed.
PROBE = r"""
d=$1
if [ "$(id -u)" = 0 ]; then s=; elif sudo -n true 2>/dev/null; then s="sudo -n"; else s=no; fi
if [ "$s" = no ]; then echo root=no; else echo root=yes; fi
if [ -x "$d/$2" ] && [ -f "$d/$3" ]; then
  echo setup=yes; else echo setup=no; fi
echo "revision=$(git -C "$d" rev-parse HEAD 2>/dev/null)"
if [ "$s" != no ] && $s ovs-vsctl --timeout=3 show >/dev/null 2>&1; then echo ovs=yes; else echo ovs=no; fi
[ "$s" = no ] || echo "maxsessions=$($s sshd -T 2>/dev/null | awk '$1 == "maxsessions" {print $2}')"
"""


class ClusterError(MachineError):
    """A server cannot take part; the message is one line naming each such server and why."""

    def __init__(self, problems: Sequence[ServerProblem]):
        self.problems = list(problems)
        super().__init__("; ".join(p.line() for p in self.problems))


@dataclasses.dataclass(frozen=True)
class ServerProblem:
    """What one server (or a pair, ``peer``) lacks, and how to fix it."""

    server: str
    why: str
    fix: str
    peer: str = ""

    def line(self) -> str:
        where = f"cluster server {self.server!r}" + (f" to {self.peer!r}" if self.peer else "")
        return f"{where}: {self.why} ({self.fix})"


def local_revision(project_dir: str | os.PathLike = REPO_ROOT) -> str:
    """This machine's git revision of the project, or "" outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(project_dir), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def probe_words(project_dir: str) -> list[str]:
    """The probe as argv: what the server runs (and what a test runs here)."""
    return ["sh", "-c", PROBE, "probe", project_dir, SETUP_SCRIPT, SETUP_STAMP]


def probe_argv(server: Server, project_dir: str, connect_timeout_s: float,
               ssh_options: Sequence[str] = ()) -> list[str]:
    """The one ssh command that asks ``server`` everything (the remote side gets quoted words)."""
    remote = shlex.join(probe_words(project_dir))
    return [*server.ssh_argv(connect_timeout_s, ssh_options), remote]


def parse_probe(text: str) -> dict[str, str]:
    """``PROBE``'s output as a dict (lines without ``=`` are ignored)."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else "no message"


def check_server(server: Server, revision: str, project_dir: str = str(REPO_ROOT),
                 connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 ssh_options: Sequence[str] = (), sessions: int = 0) -> ServerProblem | None:
    """The first thing ``server`` lacks, or None when it is ready.

    ``sessions``: how many ssh sessions the fabric will open to it at once
    (one per node placed there, and the commands run there).
    """
    if server.is_local:
        if not ovs_running():
            return ServerProblem(server.name, "OVS not running", "run ./setup.sh here")
        return None
    argv = probe_argv(server, project_dir, connect_timeout_s, ssh_options)
    try:
        out = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             timeout=connect_timeout_s + PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return ServerProblem(server.name, f"unreachable (no answer within "
                             f"{connect_timeout_s + PROBE_TIMEOUT_S:g} s)",
                             f"check that ssh -p {server.port} {server.destination} true answers")
    except OSError as exc:
        return ServerProblem(server.name, f"cannot start ssh ({exc.strerror})",
                             "install openssh-client here")
    facts = parse_probe(out.stdout)
    if out.returncode != 0 or "root" not in facts:
        return ServerProblem(server.name, f"unreachable (ssh: {_last_line(out.stderr)})",
                             f"check that BatchMode ssh -p {server.port} {server.destination} works: "
                             "an authorized key, no password")
    return judge(server, facts, revision, project_dir, sessions)


def judge(server: Server, facts: dict[str, str], revision: str, project_dir: str,
          sessions: int = 0) -> ServerProblem | None:
    """The first thing missing by the probe's answer (``PROBE``'s KEY=VALUE lines), or None.

    Why sessions: every node's shell on a server is one session of the one
    ssh connection to it, and sshd allows 10 per connection unless told
    otherwise (``MaxSessions``); the eleventh node would fail deep inside
    Mininet with "session request failed".
    """
    if facts.get("root") != "yes":
        return ServerProblem(server.name, f"no root for {server.user or 'the ssh user'}",
                             "ssh as root or allow password-less sudo")
    if facts.get("setup") != "yes":
        return ServerProblem(server.name, f"no project set-up in {project_dir}",
                             f"check out the project at {project_dir} there and run ./setup.sh")
    theirs = facts.get("revision", "")
    if theirs != revision:
        return ServerProblem(server.name, f"other version ({theirs[:12] or 'no git revision'} "
                             f"there, {revision[:12] or 'none'} here)",
                             f"check out {revision[:12] or 'the same revision'} there and run ./setup.sh")
    if facts.get("ovs") != "yes":
        return ServerProblem(server.name, "OVS not running", "run ./setup.sh there")
    allowed = facts.get("maxsessions", "")
    if sessions and allowed.isdigit() and int(allowed) < sessions:
        return ServerProblem(server.name, f"sshd allows {allowed} sessions per connection, the fabric "
                             f"needs {sessions}",
                             f"set MaxSessions {max(sessions, 100)} in /etc/ssh/sshd_config there and "
                             "reload sshd")
    return None


def local_address_towards(server: Server) -> str:
    """This machine's source address on its route to ``server``: where that server reaches us."""
    try:
        ip = socket.gethostbyname(server.host)
        out = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    words = out.stdout.split()
    return words[words.index("src") + 1] if "src" in words[:-1] else ""


#: The frame the machines' network must carry between servers: the fabric's
#: 1500-byte frames in VXLAN (testbed.emulation.cluster.nodes.VXLAN_OVERHEAD).
TUNNEL_MTU = 1550
#: ICMP echo payload that makes a TUNNEL_MTU-byte IP packet (20 IP + 8 ICMP bytes).
TUNNEL_PING_BYTES = TUNNEL_MTU - 28


def _ping_argv(address: str, size: int | None = None) -> list[str]:
    """One ping; with ``size``, that payload with don't-fragment set (a path MTU check)."""
    sized = ["-M", "do", "-s", str(size)] if size else []
    return ["ping", "-c", "1", "-W", "2", *sized, "--", address]


def check_pair(src: Server, dst: Server, connect_timeout_s: float = CONNECT_TIMEOUT_S,
               ssh_options: Sequence[str] = ()) -> ServerProblem | None:
    """Whether ``src`` reaches ``dst``'s address (one ping), and carries a tunnelled frame there.

    The second ping is `TUNNEL_MTU` bytes with don't-fragment: a network that
    carries only 1500-byte frames would fragment every full-sized frame of
    the fabric in its tunnel (or drop it), which no figure should measure.
    """
    if dst.is_local:
        # The remote reaches this machine at our address on the route towards it.
        target = local_address_towards(src)
        if not target:
            return ServerProblem(src.name, "no route back to this machine", "check its address",
                                 peer=dst.name)
    else:
        target = dst.host
    for size in (None, TUNNEL_PING_BYTES):
        ping = _ping_argv(target, size)
        argv = ping if src.is_local else [*src.ssh_argv(connect_timeout_s, ssh_options), shlex.join(ping)]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                 timeout=connect_timeout_s + PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return ServerProblem(src.name, f"cannot reach {target}", "check the machines' network",
                                 peer=dst.name)
        if out.returncode == 0:
            continue
        said = _last_line(out.stdout + out.stderr)
        if size is None:
            return ServerProblem(src.name, f"cannot reach {target} (ping: {said})",
                                 "let the servers reach each other: tunnels run between them",
                                 peer=dst.name)
        return ServerProblem(src.name, f"does not carry {TUNNEL_MTU}-byte packets to {target} "
                             f"(ping -M do -s {size}: {said})",
                             f"raise the MTU between the machines to at least {TUNNEL_MTU}: VXLAN "
                             "adds 50 bytes to the fabric's 1500-byte frames", peer=dst.name)
    return None


def preflight(servers: Sequence[str], project_dir: str = str(REPO_ROOT),
              connect_timeout_s: float = CONNECT_TIMEOUT_S,
              ssh_options: Sequence[str] = (), sessions: dict[str, int] | None = None) -> list[Server]:
    """The spec's servers, every one checked at once; a `ClusterError` naming each bad one.

    Takes about one ``connect_timeout_s`` however many servers are named.
    ``ssh_options``: ssh's own options for every connection (``-i KEY``);
    ``sessions``: server name -> ssh sessions the fabric will open to it.
    """
    parsed = parse_servers(servers)
    check_ssh_options(ssh_options)
    revision = local_revision(project_dir)
    need = sessions or {}
    with ThreadPoolExecutor(max_workers=min(16, len(parsed))) as pool:
        results = list(pool.map(
            lambda s: check_server(s, revision, project_dir, connect_timeout_s, ssh_options,
                                   need.get(s.name, 0)), parsed))
    problems = [p for p in results if p is not None]
    if problems:
        raise ClusterError(problems)
    pairs = [(a, b) for a in parsed for b in parsed if a is not b]
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(pairs)))) as pool:
        results = list(pool.map(lambda ab: check_pair(ab[0], ab[1], connect_timeout_s, ssh_options), pairs))
    problems = [p for p in results if p is not None]
    if problems:
        raise ClusterError(problems)
    return parsed
