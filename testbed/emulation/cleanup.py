"""Remove only what dblp-testbed created, by its own names and recorded PIDs.

Recognition: every live fabric writes a state file in ``STATE_DIR`` listing
its bridges, host shells, controller and helper PIDs (with their command
lines, so a recycled PID is never killed) and socket paths. Bridges and
root-namespace interfaces are also recognised by name (``dt`` + layer letter +
digits, see ``topologies.SWITCH_NAME_RE``), nftables tables by their
``dtburst_`` prefix, and host shells by Mininet's ``mininet:<host>`` tag for
host names our topologies use. Anything else on the machine is left alone.
"""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import time

from topologies.graph import SWITCH_NAME_RE

STATE_DIR = os.environ.get("DBLP_TESTBED_STATE_DIR", "/run/dblp-testbed")
NFT_PREFIX = "dtburst_"
INTF_RE = re.compile(r"^(dt[a-z]\d{1,4})-eth\d+$")
HOST_RE = re.compile(r"^(h\d{3}|srv|w\d{1,2}|x\d|l\d{1,2}h\d{1,2})$")


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
            s["_path"] = p
            out.append(s)
        except (OSError, ValueError):
            out.append({"_path": p})
    return out


def kill_pid(pid: int, expect: str | None = None, group: bool = False, grace: float = 2.0) -> bool:
    """SIGTERM then SIGKILL one PID (or its process group) if its cmdline still matches."""
    cl = cmdline(pid)
    if not cl or (expect and expect not in cl):
        return False
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    deadline = time.time() + grace
    while time.time() < deadline and cmdline(pid):
        time.sleep(0.05)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    if cmdline(pid):
        try:
            (os.killpg if group else os.kill)(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return True


def kill_many(records, grace: float = 2.0) -> list:
    """Signal every matching PID at once, wait up to ``grace`` in total, then SIGKILL.

    Records: dicts with pid, expect (cmdline substring), group (signal the
    process group), sig (first signal; host shells get SIGKILL because an
    interactive bash ignores SIGTERM, which made a 16-host tear-down take 32 s).
    """
    live = []
    for r in records:
        cl = cmdline(r["pid"])
        if not cl or (r.get("expect") and r["expect"] not in cl):
            continue
        try:
            (os.killpg if r.get("group") else os.kill)(r["pid"], r.get("sig", signal.SIGTERM))
            live.append(r)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.time() + grace
    while time.time() < deadline and any(cmdline(r["pid"]) for r in live):
        for r in live:
            try:
                os.waitpid(r["pid"], os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.05)
    for r in live:
        if cmdline(r["pid"]):
            try:
                (os.killpg if r.get("group") else os.kill)(r["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return [r["pid"] for r in live]


def project_bridges() -> list:
    r = _run(["ovs-vsctl", "--timeout=10", "list-br"])
    if r is None or r.returncode:
        return []
    return [b for b in r.stdout.split() if SWITCH_NAME_RE.match(b)]


def project_links() -> list:
    r = _run(["ip", "-o", "link", "show"])
    if r is None:
        return []
    names = []
    for line in r.stdout.splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0]
        if INTF_RE.match(name):
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


def project_host_shells(names=None) -> list:
    """PIDs of Mininet host shells (``mininet:<host>``) for project host names."""
    pids = []
    for d in glob.glob("/proc/[0-9]*"):
        pid = int(d.rsplit("/", 1)[1])
        cl = cmdline(pid)
        m = re.search(r"\bmininet:(\S+)$", cl)
        if not m or "bash" not in cl:
            continue
        if (names is not None and m.group(1) in names) or (names is None and HOST_RE.match(m.group(1))):
            pids.append(pid)
    return pids


def leftovers() -> dict:
    """What `clean` would remove, without removing it."""
    return {"bridges": project_bridges(), "links": project_links(),
            "nft_tables": [f"{f} {n}" for f, n in project_nft_tables()],
            "host_shells": project_host_shells(),
            "state_files": [s["_path"] for s in read_states()]}


def clean_state(state: dict, report: dict):
    """Kill the PIDs one fabric recorded (controller, helpers, host shells)."""
    recs = [dict(r, sig=signal.SIGKILL) if str(r.get("expect", "")).startswith("mininet:") else r
            for r in state.get("processes", [])]
    report["processes"] += kill_many(recs)
    for b in state.get("bridges", []):
        if SWITCH_NAME_RE.match(b):
            r = _run(["ovs-vsctl", "--timeout=10", "--if-exists", "del-br", b])
            if r is not None and r.returncode == 0 and b in report.get("_live_bridges", []):
                report["bridges"].append(b)
            elif r is None or r.returncode != 0:
                # OVS is down: its database keeps the bridge and brings it
                # back on restart. Keep the state file so the next fabric
                # (its owner is dead by then) or `clean` removes it.
                state["_incomplete"] = True
    for p in state.get("files", []):
        try:
            os.unlink(p)
            report["files"].append(p)
        except OSError:
            pass


def clean(only_state: dict | None = None) -> dict:
    """Remove project leftovers; returns what was removed.

    With ``only_state`` (a fabric's own state), only that fabric's PIDs and
    names are touched, so one fabric's teardown cannot hurt another's.
    """
    report = {"processes": [], "bridges": [], "links": [], "nft_tables": [], "files": [],
              "host_shells": [], "_live_bridges": project_bridges()}
    states = [only_state] if only_state is not None else read_states()
    for s in states:
        clean_state(s, report)
    hosts = None
    if only_state is not None:
        hosts = set(only_state.get("hosts", []))
    report["host_shells"] += kill_many([{"pid": pid, "expect": "mininet:", "sig": signal.SIGKILL}
                                        for pid in project_host_shells(hosts)], grace=1.0)
    own_bridges = set(only_state.get("bridges", [])) if only_state is not None else None
    for b in project_bridges():
        if own_bridges is None or b in own_bridges:
            r = _run(["ovs-vsctl", "--timeout=10", "--if-exists", "del-br", b])
            if r is not None and r.returncode == 0:
                report["bridges"].append(b)
    for name in project_links():
        if own_bridges is None or INTF_RE.match(name).group(1) in own_bridges:
            r = _run(["ip", "link", "del", name])
            if r is not None and r.returncode == 0:
                report["links"].append(name)
    for fam, name in project_nft_tables():
        # Only one fabric runs at a time (COMMON.md), so every dtburst_ table
        # belongs to the fabric being cleaned.
        if True:
            r = _run(["nft", "delete", "table", fam, name])
            if r is not None and r.returncode == 0:
                report["nft_tables"].append(f"{fam} {name}")
    for s in states:
        path = s.get("_path") or (os.path.join(STATE_DIR, f"{s['id']}.json") if s.get("id") else None)
        if path and not s.pop("_incomplete", False):
            try:
                os.unlink(path)
            except OSError:
                pass
    report.pop("_live_bridges")
    report["bridges"] = sorted(set(report["bridges"]))
    return report
