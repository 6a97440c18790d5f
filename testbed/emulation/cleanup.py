"""Remove only what dblp-testbed created: by recorded PIDs and this fabric's own names.

Recognition: every fabric writes a state file in ``STATE_DIR`` listing its
bridges, host shells, controller and helper PIDs (each with its command line
and start time, so a recycled PID is never signalled), its loss sink and the
prefix of its nftables tables (``dtburst_<tag>_``, ``<tag>`` six hex digits
of the fabric's id), and its socket paths. A fabric is *live* while the
process that owns it runs; only one fabric may be live on a machine at a time
(Mininet names interfaces machine-wide), which ``claim_machine`` enforces
with a lock the kernel releases when its owner dies.

``clean()`` stops only PIDs that a state file records, and never touches a
live fabric unless ``force``: it finishes the state of dead fabrics, then
removes project-named leftovers nobody records (bridges ``dt`` + layer
letter + digits, see ``topologies.SWITCH_NAME_RE``, their veths, loss sinks
and ``dtburst_`` tables), and only when no fabric is live, since a live one
may own them. The bench's namespace pairs (``dbt-*``) carry their owner's
PID in their name and go whenever that process is gone. Host shells are
never matched by name: another user's Mininet uses the same
``mininet:<host>`` tags.
"""
from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import signal
import subprocess
import time

from testbed.errors import MachineError
from topologies.graph import SWITCH_NAME_RE

STATE_DIR = os.environ.get("DBLP_TESTBED_STATE_DIR", "/run/dblp-testbed")
LOCK_FILE = "machine.lock"
NFT_PREFIX = "dtburst_"
INTF_RE = re.compile(r"^(dt[a-z]\d{1,4})-eth\d+$")
TAG_RE = re.compile(r"^[0-9a-f]{6}$")
SINK_RE = re.compile(r"^dtz[0-9a-f]{6}-eth[01]$")
#: A bench's namespace pair (`testbed.emulation.netns.NetnsPair`): its tag is the owner's
#: PID in six hex digits and three random ones.
NETNS_RE = re.compile(r"^dbt-([0-9a-f]{6})[0-9a-f]{3}-[ab]$")
NETNS_DIR = "/run/netns"
_TAGGED_TABLE_RE = re.compile(rf"^{NFT_PREFIX}([0-9a-f]{{6}})_")


# -- names of one fabric ------------------------------------------------------

def nft_prefix(tag: str) -> str:
    """Prefix of every nftables table the fabric ``tag``'s controller creates."""
    _check_tag(tag)
    return f"{NFT_PREFIX}{tag}_"


def sink_pair(tag: str) -> tuple[str, str]:
    """The veth pair ``loss`` bursts of fabric ``tag`` forward their victims into.

    ``dtz`` + six hex digits + ``-ethN`` fits the kernel's 15-byte interface
    names and matches neither a switch nor a switch port.
    """
    _check_tag(tag)
    return f"dtz{tag}-eth0", f"dtz{tag}-eth1"


def _check_tag(tag: str) -> None:
    if not TAG_RE.match(tag):
        raise ValueError(f"fabric tag must be six hex digits, got {tag!r}")


# -- processes ------------------------------------------------------------------

def _run(argv, timeout=20):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None if it is gone).

    With the PID it identifies a process uniquely: a PID recycled after the
    recorded process died has another start time.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def parent(pid: int) -> int:
    """The parent's PID (0 when the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def all_processes() -> list[tuple[int, str]]:
    """(pid, command line) of every process on the machine."""
    pids = (int(d.rsplit("/", 1)[1]) for d in glob.glob("/proc/[0-9]*"))
    return [(pid, cmdline(pid)) for pid in pids]


def own_children() -> list[tuple[int, str]]:
    """(pid, command line) of this process's direct children."""
    me = os.getpid()
    return [(pid, cl) for pid, cl in all_processes() if parent(pid) == me]


def record(pid: int, expect: str, **extra) -> dict:
    """A process record for a state file: what `kill_many` needs to find exactly it."""
    return {"pid": pid, "expect": expect, "start": start_time(pid), **extra}


def _is_recorded(r: dict) -> bool:
    """The recorded process still runs: same PID, command line and start time."""
    cl = cmdline(r["pid"])
    if not cl or (r.get("expect") and r["expect"] not in cl):
        return False
    return r.get("start") is None or start_time(r["pid"]) == r["start"]


def _signal(r: dict, sig: int) -> bool:
    try:
        (os.killpg if r.get("group") else os.kill)(r["pid"], sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def kill_many(records, grace: float = 2.0) -> list:
    """Signal every recorded process that still runs at once, wait up to ``grace``, then SIGKILL.

    Records: dicts with pid, expect (cmdline substring), start (start time,
    see `start_time`), group (signal the process group), sig (first signal;
    host shells get SIGKILL because an interactive bash ignores SIGTERM,
    which made a 16-host tear-down take 32 s).
    """
    live = [r for r in records if _is_recorded(r) and _signal(r, r.get("sig", signal.SIGTERM))]
    deadline = time.time() + grace
    while time.time() < deadline and any(cmdline(r["pid"]) for r in live):
        for r in live:
            try:
                os.waitpid(r["pid"], os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.05)
    for r in live:
        if _is_recorded(r):
            _signal(r, signal.SIGKILL)
    return [r["pid"] for r in live]


# -- state files and the machine lock ------------------------------------------------

def write_state(fabric_id: str, state: dict) -> str:
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    path = os.path.join(STATE_DIR, f"{fabric_id}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)
    return path


def read_states() -> list:
    out = []
    for p in sorted(glob.glob(os.path.join(STATE_DIR, "*.json"))):
        try:
            with open(p) as f:
                s = json.load(f)
            if not isinstance(s, dict):
                raise ValueError("not an object")
            s["_path"] = p
            out.append(s)
        except (OSError, ValueError):
            out.append({"_path": p})
    return out


def owner_record(**extra) -> dict:
    """The record of the process that owns a fabric (this one)."""
    return record(os.getpid(), "", **extra)


def is_live(state: dict) -> bool:
    """The fabric's owner still runs (same PID and start time) and has not stopped it."""
    if state.get("stopped"):
        return False
    owner = state.get("owner")
    if isinstance(owner, dict) and isinstance(owner.get("pid"), int):
        return _is_recorded(owner)
    pid = state.get("pid")  # a state file written before owners were recorded
    return isinstance(pid, int) and os.path.exists(f"/proc/{pid}")


def describe(state: dict) -> str:
    """One line naming a fabric: its id, its owner's PID and its run directory."""
    owner = state.get("owner") or {}
    pid = owner.get("pid", state.get("pid", "?"))
    where = f", run directory {state['run_dir']}" if state.get("run_dir") else ""
    return f"fabric {state.get('id', '?')} of pid {pid}{where}"


def live_fabric() -> dict | None:
    """The state of the fabric live on this machine, or None."""
    for s in read_states():
        if is_live(s):
            return s
    return None


def claim_machine(state: dict) -> int:
    """Take the machine for one fabric; refuse with a `MachineError` naming a live one.

    An exclusive ``flock`` on ``STATE_DIR/machine.lock``, held until
    `release_machine` or the owner's death, so two runs started at once
    cannot both pass; the state is written while the lock is held.
    """
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(STATE_DIR, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        live = live_fabric()
        who = describe(live) if live else "a fabric that is starting"
        raise MachineError(f"another run is live on this machine: {who}; wait for it to finish "
                           "(Mininet names interfaces machine-wide)") from None
    live = [s for s in read_states() if s.get("id") != state.get("id") and is_live(s)]
    if live:  # its owner holds no lock (an older harness): still refuse
        os.close(fd)
        raise MachineError(f"another run is live on this machine: {describe(live[0])}; "
                           "wait for it to finish (Mininet names interfaces machine-wide)")
    write_state(state["id"], state)
    return fd


def release_machine(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


# -- what the machine holds, by the project's names ------------------------------------

def project_bridges() -> list:
    r = _run(["ovs-vsctl", "--timeout=10", "list-br"])
    if r is None or r.returncode:
        return []
    return [b for b in r.stdout.split() if SWITCH_NAME_RE.match(b)]


def project_links() -> list:
    """Root-namespace interfaces named like a switch port or a loss sink of ours."""
    r = _run(["ip", "-o", "link", "show"])
    if r is None:
        return []
    names = []
    for line in r.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        if INTF_RE.match(name) or SINK_RE.match(name):
            names.append(name)
    return names


def project_nft_tables() -> list:
    r = _run(["nft", "list", "tables"])
    if r is None or r.returncode:
        return []
    out = []
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "table" and parts[2].startswith(NFT_PREFIX):
            out.append((parts[1], parts[2]))
    return out


def _boot_time() -> float:
    with open("/proc/stat") as f:
        return float(next(line.split()[1] for line in f if line.startswith("btime ")))


def _owner_alive(name: str) -> bool:
    """Whether the process that made namespace ``name`` (its PID is in the name) still runs.

    A PID recycled after the owner died belongs to a process started after
    the namespace was made: that one is not the owner.
    """
    m = NETNS_RE.match(name)
    started = start_time(int(m.group(1), 16)) if m else None
    if started is None:
        return False
    try:
        made = os.stat(os.path.join(NETNS_DIR, name)).st_mtime
    except OSError:
        return False
    return _boot_time() + started / os.sysconf("SC_CLK_TCK") <= made + 1.0


def project_namespaces(dead_only: bool = True) -> list:
    """Bench namespaces (``dbt-<owner><rand>-a|b``), by default only those of dead owners.

    A bench removes its pair on exit; one killed before its exit (SIGKILL)
    leaves it, and nothing but the name says whose it was.
    """
    r = _run(["ip", "netns", "list"])
    if r is None or r.returncode:
        return []
    names = [line.split()[0] for line in r.stdout.splitlines() if line.split()]
    return [n for n in names if NETNS_RE.match(n) and not (dead_only and _owner_alive(n))]


def stray_host_shells() -> list:
    """PIDs of Mininet host shells (``mininet:<host>``) on the machine: reported, never stopped.

    They may be another user's Mininet; clean-up stops only shells a state
    file records.
    """
    pids = []
    for d in glob.glob("/proc/[0-9]*"):
        pid = int(d.rsplit("/", 1)[1])
        cl = cmdline(pid)
        if "bash" in cl and re.search(r"\bmininet:\S+$", cl):
            pids.append(pid)
    return pids


def leftovers() -> dict:
    """What `clean` would remove (and the live fabrics it would leave alone), removing nothing."""
    states = read_states()
    live = [s for s in states if is_live(s)]
    dead = [s for s in states if not is_live(s)]
    return {"bridges": project_bridges(), "links": project_links(),
            "nft_tables": [f"{f} {n}" for f, n in project_nft_tables()],
            "namespaces": project_namespaces(),
            "processes": [r["pid"] for s in dead for r in s.get("processes", [])
                          if isinstance(r, dict) and _is_recorded(r)],
            "host_shells": stray_host_shells(),
            "state_files": [s["_path"] for s in dead],
            "live": [describe(s) for s in live]}


# -- removing -------------------------------------------------------------------

def _records(state: dict) -> list:
    recs = [r for r in state.get("processes", []) if isinstance(r, dict)
            and isinstance(r.get("pid"), int)]
    return [dict(r, sig=signal.SIGKILL) if str(r.get("expect", "")).startswith("mininet:") else r
            for r in recs]


def _del_bridge(b: str, report: dict) -> bool:
    r = _run(["ovs-vsctl", "--timeout=10", "--if-exists", "del-br", b])
    if r is None or r.returncode != 0:
        return False
    if b in report["_live_bridges"]:
        report["bridges"].append(b)
    return True


def _del_link(name: str, report: dict) -> None:
    r = _run(["ip", "link", "del", name])
    if r is not None and r.returncode == 0:
        report["links"].append(name)


def _del_table(fam: str, name: str, report: dict) -> None:
    r = _run(["nft", "delete", "table", fam, name])
    if r is not None and r.returncode == 0:
        report["nft_tables"].append(f"{fam} {name}")


def _del_namespace(name: str, report: dict) -> None:
    r = _run(["ip", "netns", "del", name])
    if r is not None and r.returncode == 0:
        report["namespaces"].append(name)


def _owns_table(state: dict, name: str) -> bool:
    """Tables with the fabric's prefix, and untagged ``dtburst_`` tables.

    An untagged table comes from a controller that does not yet name its
    tables per fabric; it can only be the cleaning fabric's or a dead run's,
    because a fabric cleans while it holds the machine.
    """
    prefix = state.get("nft_prefix")
    return bool(prefix and name.startswith(prefix)) or not _TAGGED_TABLE_RE.match(name)


def clean_state(state: dict, report: dict) -> bool:
    """Remove what one fabric recorded; False if something had to stay (OVS down)."""
    complete = True
    report["processes"] += kill_many(_records(state))
    for b in state.get("bridges", []):
        if SWITCH_NAME_RE.match(b) and not _del_bridge(b, report):
            # OVS is down: its database keeps the bridge and brings it back
            # on restart. Keep the state file so the next fabric (its owner
            # is dead by then) or `clean` removes it.
            complete = False
    own = set(state.get("bridges", []))
    for name in project_links():
        m = INTF_RE.match(name)
        if (m and m.group(1) in own) or name in state.get("links", []):
            _del_link(name, report)
    for fam, name in project_nft_tables():
        if _owns_table(state, name):
            _del_table(fam, name, report)
    for p in state.get("files", []):
        try:
            os.unlink(p)
            report["files"].append(p)
        except OSError:
            pass
    return complete


def _forget(state: dict) -> None:
    path = state.get("_path") or (os.path.join(STATE_DIR, f"{state['id']}.json")
                                  if state.get("id") else None)
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def clean(only_state: dict | None = None, force: bool = False) -> dict:
    """Remove project leftovers; returns what was removed and which live runs stayed.

    With ``only_state`` (a fabric's own state, at its tear-down), only what
    that fabric recorded or names as its own is touched. Without it, dead
    fabrics' states are finished and unrecorded project-named leftovers go,
    while a live fabric and everything that may be its own stay, unless
    ``force``.
    """
    report = {"processes": [], "bridges": [], "links": [], "nft_tables": [], "namespaces": [],
              "files": [], "live": [], "_live_bridges": project_bridges()}
    if only_state is not None:
        if clean_state(only_state, report):
            _forget(only_state)
        elif only_state.get("id"):
            # What stayed is a dead fabric's from now on, whoever still runs.
            only_state["stopped"] = True
            write_state(only_state["id"], {k: v for k, v in only_state.items() if k != "_path"})
        return _finish(report)
    states = read_states()
    live = [s for s in states if is_live(s)]
    if live and not force:
        report["live"] = [describe(s) for s in live]
        states = [s for s in states if s not in live]
    for s in states:
        if clean_state(s, report):
            _forget(s)
    for name in project_namespaces():  # no fabric's: a dead bench's, live fabric or not
        _del_namespace(name, report)
    if not report["live"]:
        for b in project_bridges():
            _del_bridge(b, report)
        for name in project_links():
            _del_link(name, report)
        for fam, name in project_nft_tables():
            _del_table(fam, name, report)
    return _finish(report)


def _finish(report: dict) -> dict:
    report.pop("_live_bridges")
    report["bridges"] = sorted(set(report["bridges"]))
    return report
