"""What this machine can emulate, and for each missing piece one actionable line.

Used by `dblp-testbed doctor` and, before anything is built, by ``Fabric``.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess

from testbed.errors import MachineError

TOOLS = ("mnexec", "ovs-vsctl", "ovs-ofctl", "tc", "ip", "nft", "ethtool", "tcpdump", "iperf3")
QDISCS = ("htb", "pfifo", "tbf", "bfifo", "netem", "fq_codel", "red")
WMEM_MIN = 1 << 20  # below this a 100-packet queue overflows OVS's TX socket


def _run(argv, timeout=10):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)


def ovs_running() -> bool:
    return shutil.which("ovs-vsctl") is not None and _run(["ovs-vsctl", "--timeout=5", "show"])[0] == 0


def kernel_datapath() -> bool:
    """True when the OVS kernel module is loaded (it is in a VM, not in this sandbox)."""
    return os.path.isdir("/sys/module/openvswitch")


def qdisc_available(kind: str) -> bool:
    """Probe a qdisc on a throw-away dummy-free target: the loopback's ingress-free
    ``tc qdisc add`` would change lo, so instead ask tc to parse it in a new
    network namespace (root only)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    args = {"htb": ["htb"], "pfifo": ["pfifo", "limit", "10"], "bfifo": ["bfifo", "limit", "10000"],
            "tbf": ["tbf", "rate", "1mbit", "burst", "10k", "latency", "10ms"],
            "netem": ["netem", "delay", "1ms"], "fq_codel": ["fq_codel"], "red": [
                "red", "limit", "100000", "avpkt", "1000", "probability", "0.1", "bandwidth", "1mbit",
                "min", "10000", "max", "30000", "burst", "20"]}[kind]
    code, _ = _run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root"] + args)
    return code == 0


def nft_netdev_egress() -> bool:
    """nftables netdev egress hook (what the `loss` burst uses)."""
    if os.geteuid() != 0 or shutil.which("nft") is None:
        return False
    script = ("ip link add dtprobe0 type veth peer name dtprobe1 && nft -f - <<'EOF'\n"
              "table netdev dtprobe {\n chain e {\n"
              "  type filter hook egress device \"dtprobe0\" priority 0;\n"
              "  numgen random mod 100 < 50 counter drop\n }\n}\nEOF")
    code, _ = _run(["unshare", "--net", "sh", "-c", script])
    return code == 0


def module_importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def sysctl_int(name: str):
    try:
        with open("/proc/sys/" + name.replace(".", "/")) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError):
        return None


def c_core() -> dict:
    """Whether dblp's C core (``dblp._fastpath``) loads here, and from where.

    It is built by the install where a compiler is; without it the transport
    runs its pure-Python path, the same bytes on the wire but several times
    the CPU per datagram, which moves every timing at high rates. The
    manifest records this with the capabilities, so a result says which
    path it measured, and which library computes keyed jobs' tags in it
    (``mac``: "intel-ipsec-mb", "libcrypto", or None when keyed jobs take the
    Python path).
    """
    try:
        core = importlib.import_module("dblp._fastpath")
    except ImportError as exc:
        return {"loaded": False, "path": None, "error": str(exc), "mac": None}
    return {"loaded": True, "path": getattr(core, "__file__", None), "error": None,
            "mac": getattr(core, "MAC_BACKEND", None)}


def c_core_warning(core: dict) -> str | None:
    """The line `doctor` notes and `run` says at its start when the C core is missing."""
    if core["loaded"]:
        return None
    return (f"dblp's C core not loaded ({core['error']}): the transport runs its pure-Python "
            "path, several times the CPU per datagram, and every timing moves; rebuild it with "
            "./setup.sh (needs a C compiler)")


def check(probe_qdiscs: bool = True) -> dict:
    """A JSON-able capability report with ``problems`` (blocking) and ``notes``."""
    rep = {"root": os.geteuid() == 0,
           "tools": {t: shutil.which(t) is not None for t in TOOLS},
           "ovs_running": ovs_running(),
           "kernel_datapath": kernel_datapath(),
           "modules": {m: module_importable(m) for m in ("os_ken", "mininet", "torch", "scapy")},
           "wmem_default": sysctl_int("net.core.wmem_default"),
           "c_core": c_core()}
    rep["datapath"] = "kernel" if rep["kernel_datapath"] else "user"
    if probe_qdiscs:
        rep["qdiscs"] = {q: qdisc_available(q) for q in QDISCS}
        rep["nft_netdev_egress"] = nft_netdev_egress()
    problems, notes = [], []
    if not rep["root"]:
        problems.append("not root: run the emulation as root (sudo dblp-testbed ...)")
    for t, ok in rep["tools"].items():
        if not ok:
            problems.append(f"{t} missing: run ./setup.sh (installs mininet, openvswitch-switch, "
                            "tcpdump, iperf3, ethtool, nftables)")
    if rep["tools"]["ovs-vsctl"] and not rep["ovs_running"]:
        problems.append("Open vSwitch not running: /usr/share/openvswitch/scripts/ovs-ctl start "
                        "(or ./setup.sh)")
    for m, ok in rep["modules"].items():
        if not ok:
            problems.append(f"python module {m} not importable: run ./setup.sh")
    if probe_qdiscs:
        for q in ("htb", "pfifo"):
            if rep["root"] and not rep["qdiscs"][q]:
                problems.append(f"qdisc {q} unavailable: links cannot be shaped (kernel lacks sch_{q})")
        if rep["root"] and not rep["qdiscs"]["netem"]:
            notes.append("netem absent: delay/loss come from nftables and HTB+pfifo, not Mininet's TCLink")
        if rep["root"] and not rep["nft_netdev_egress"]:
            notes.append("nftables netdev egress hook unavailable: `loss` bursts will fail "
                         "(use `police` or `congest`)")
    core_note = c_core_warning(rep["c_core"])
    if core_note:
        notes.append(core_note)
    if not rep["kernel_datapath"]:
        notes.append("OVS kernel datapath absent: using the userspace datapath (one forwarding "
                     "thread; see docs/results/capacity.md)")
    if (rep["wmem_default"] or 0) < WMEM_MIN:
        notes.append(f"net.core.wmem_default={rep['wmem_default']} < {WMEM_MIN}: OVS's TX socket may "
                     "overflow deep queues; run ./setup.sh before OVS starts")
    rep["problems"], rep["notes"] = problems, notes
    rep["ok"] = not problems
    return rep


def require(report=None):
    """Raise a `MachineError` naming the first problem if the fabric cannot be built.

    A `MachineError`, not a bare exception: every command that builds a
    fabric (`run`, `net check`, `net cli`, the benches) then ends with one
    line and exit 2 instead of a traceback, the way `run` already did.
    """
    report = report or check(probe_qdiscs=False)
    problems = report["problems"]
    if problems:
        more = f" (and {len(problems) - 1} more: dblp-testbed doctor)" if len(problems) > 1 else ""
        raise MachineError(f"cannot build the fabric: {problems[0]}{more}")
    return report
