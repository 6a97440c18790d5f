"""The emulation lifecycle: a routed Mininet fabric as a context manager.

Use (the orchestrator's API)::

    from topologies import make_topology
    from testbed.emulation.fabric import Fabric

    topo = make_topology("fattree", k=4)          # or "star", "leafspine"
    with Fabric(topo, run_dir=RUN, bw_mbps=20, queue_pkts=100,
                controller_socket=None,            # default RUN/control.sock
                bursts=None,                       # BurstSchedule.to_dict() (controllers.bursts)
                roles=None,                        # {"server": h, "workers": [...]} override
                monitor_s=5.0,                     # port stats into RUN/raw/port_stats.jsonl
                chunk_bytes=None) as fab:          # the job's; fragmented: raised reassembly limits
        fab.startup_s                    # seconds from __enter__ to routed
        fab.server, fab.workers          # role placement: fab.place(n) for n workers
        fab.role("cross")                # cross-traffic hosts
        h = fab.host("h000")             # HostHandle: .name .ip .mac .intf .pid
        fab.ip("h000"), fab.intf("h000")
        p = fab.popen("h000", ["python", "-m", "workloads.server", ...],
                      env={...}, stdout=f, stderr=subprocess.STDOUT)   # subprocess.Popen
        fab.run("h100", ["ping", "-c1", fab.ip("h000")], timeout=5)  # CompletedProcess
        fab.control({"op": "status"})    # one request on the controller's socket (controllers.protocol)
        fab.control_socket               # path; put it in DBLP_CONTROL_SOCKET
        fab.net                          # the Mininet object (CLI, debugging)

Commands run in a host's network (and mount) namespace through ``mnexec -a
<pid>`` with a list argv, never a shell string. Every Popen is started in its
own session and killed by process group at teardown if still running.

What ``__enter__`` does, in order: capability check (root, OVS running, tools,
os-ken/mininet importable); pick the OVS datapath (kernel if the openvswitch
module is loaded, as in a VM; userspace otherwise, as in this sandbox); record
a state file for `dblp-testbed clean`; build OpenFlow 1.3 switches with
explicit DPIDs and ``fail_mode=secure`` (no standalone flooding); shape every
interface with HTB plus a ``pfifo limit N`` drop-tail child (Mininet's own
queue option needs netem, absent here); turn TX offload off on host
interfaces (TCP over the userspace datapath needs it); raise each host's IP
reassembly limits when the job's chunks are IP-fragmented (``chunk_bytes``,
``reassembly_sysctls``); start the controller
process (os-ken, ``controllers.run``) with the topology JSON; start the
switches; wait until every switch is connected and its routes are confirmed
by a barrier. ``__exit__`` (also on exceptions, Ctrl-C and failed start-up)
stops helper processes, the controller and Mininet, then removes any
remaining bridge, veth, nftables table or host shell this fabric recorded.

One fabric per machine: ``__enter__`` claims the machine
(``cleanup.claim_machine``) and a second fabric is refused with a
``MachineError`` naming the live one, because Mininet names interfaces and
bridges machine-wide. Names that are the fabric's own still carry its tag
(six hex digits of its id): the loss sink ``dtz<tag>-eth0/1`` and the
controller's nftables tables ``dtburst_<tag>_*``, so clean-up of one fabric
can never remove another's.
"""
from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

from controllers.protocol import ControlClient, StatusRequest
from dblp.testing import free_port
from testbed import REPO_ROOT, output
from testbed.emulation import capabilities, cleanup
from topologies import TopoGraph

#: IP reassembly limits a host gets when a job's chunks are IP-fragmented
#: (``reassembly_sysctls``). Linux's defaults (4 MiB, 3 MiB, 30 s) stall a
#: receiver after a loss burst: its reassembly memory fills with datagrams that
#: lost a fragment, and every fragment after that is dropped until they expire
#: (docs/results/paper-prototype.md). Linux 6.18, written in a fresh
#: namespace, takes any high threshold from the low one up to 2^63-1 (one
#: below the low one is refused) and any ``ipfrag_time``, unchecked; 1 GiB
#: holds the incomplete datagrams of more than a second of 100 Mbit/s
#: traffic many times over, and one second is ample for the fragments of one
#: datagram, which leave back to back, to arrive.
REASSEMBLY_LIMITS = {"net.ipv4.ipfrag_high_thresh": 1 << 30,
                     "net.ipv4.ipfrag_low_thresh": 3 << 28,
                     "net.ipv4.ipfrag_time": 1}


def reassembly_sysctls(chunk_bytes: int | None) -> dict[str, int]:
    """The sysctls each host's namespace gets for a job with ``chunk_bytes`` chunks.

    None for chunks that fit one datagram at the MTU (nothing to reassemble:
    the kernel's defaults stay), else ``REASSEMBLY_LIMITS``. The low
    threshold is written after the high one: the kernel keeps low <= high.
    """
    from dblp import wire

    if chunk_bytes is None or wire.fragments(wire.datagram_size(chunk_bytes)) == 1:
        return {}
    return dict(REASSEMBLY_LIMITS)


#: Where a machine's C library finds its name servers (resolv.conf(5)).
RESOLV_CONF = "/etc/resolv.conf"


def name_servers(resolv_conf: str) -> list[str]:
    """The IPv4 name servers a resolv.conf text lists, in its order.

    Each host gets an unreachable route to them (``Fabric._configure_interfaces``):
    a lookup from a host (torch's c10d asks for every peer's host name) went into
    the fabric towards this machine's name server, 10.255.255.53, inside the
    fabric's 10.0.0.0/8, and waited 5 s for an answer that never came (each gloo
    worker started 6.2 s late). Refused at once, it fails in 0.1 s, and no DNS
    query enters the fabric's links, queues or captures.
    """
    out = []
    for line in resolv_conf.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                out.append(str(ipaddress.IPv4Address(words[1])))
            except ValueError:
                continue  # IPv6: the hosts have no IPv6 route
    return out


@dataclass
class HostHandle:
    name: str
    ip: str
    mac: str
    intf: str
    pid: int


def _mininet_topo(topo: TopoGraph):
    from mininet.topo import Topo

    t = Topo()
    for h in topo.hosts():
        hi = topo.host_info[h]
        t.addHost(h, ip=f"{hi.ip}/{topo.prefixlen}", mac=hi.mac)
    for s in topo.switches():
        t.addSwitch(s, dpid=f"{topo.dpid_of(s):016x}")
    for link in topo.links():
        t.addLink(link.node1, link.node2, port1=link.port1, port2=link.port2)
    return t


def shaping_batch(intfs, bw_mbps: float, queue_pkts: int) -> str:
    """``tc -batch`` text: HTB at bw with a ``pfifo limit N`` child per interface."""
    rate = f"{bw_mbps}mbit"
    # burst of a few MTUs keeps HTB accurate at low rates on a busy 2-core host
    burst = max(3000, int(bw_mbps * 1e6 / 8 / 250))
    lines = []
    for i in intfs:
        lines += [f"qdisc replace dev {i} root handle 1: htb default 1",
                  f"class replace dev {i} parent 1: classid 1:1 htb rate {rate} ceil {rate} "
                  f"burst {burst} cburst {burst}",
                  f"qdisc replace dev {i} parent 1:1 handle 10: pfifo limit {queue_pkts}"]
    return "\n".join(lines) + "\n"


class Fabric:
    """A routed emulated fabric for the lifetime of a ``with`` block."""

    def __init__(self, topo: TopoGraph, run_dir: str, bw_mbps: float | None = 20.0,
                 queue_pkts: int = 100, controller_socket: str | None = None,
                 bursts=None, roles: dict | None = None, datapath: str = "auto",
                 ready_timeout_s: float = 90.0, tx_offload_off: bool = True,
                 monitor_s: float = 5.0, log=None, chunk_bytes: int | None = None):
        if not isinstance(topo, TopoGraph):
            raise TypeError(f"topo must be a topologies.TopoGraph, got {type(topo).__name__}")
        if bw_mbps is not None and not (isinstance(bw_mbps, (int, float)) and 0.1 <= bw_mbps <= 10000):
            raise ValueError(f"bw_mbps must be a number in 0.1..10000 (or None: unshaped), got {bw_mbps!r}")
        if not isinstance(queue_pkts, int) or not 1 <= queue_pkts <= 100000:
            raise ValueError(f"queue_pkts must be an integer in 1..100000, got {queue_pkts!r}")
        if datapath not in ("auto", "user", "kernel"):
            raise ValueError(f"datapath must be auto, user or kernel, got {datapath!r}")
        self.topo, self.bw_mbps, self.queue_pkts = topo, bw_mbps, queue_pkts
        self.run_dir = os.path.abspath(run_dir)
        self.raw_dir = os.path.join(self.run_dir, "raw")
        self.bursts = bursts
        for h in ([roles.get("server")] if roles and roles.get("server") else []) + \
                list((roles or {}).get("workers", [])):
            if h not in topo.host_info:
                raise ValueError(f"roles names host {h!r}, which {topo.name} does not have")
        self.roles = dict(topo.roles, **(roles or {}))
        self.datapath_req = datapath
        self.ready_timeout_s = ready_timeout_s
        self.tx_offload_off = tx_offload_off
        # The job's chunk size: IP-fragmented chunks get raised reassembly limits.
        self.reassembly = reassembly_sysctls(chunk_bytes)
        if not isinstance(monitor_s, (int, float)) or monitor_s < 0:
            raise ValueError(f"monitor_s must be >= 0 (0: no port statistics), got {monitor_s!r}")
        self.monitor_s = monitor_s
        self.log = log or (lambda msg: output.say(f"fabric: {msg}"))
        self.control_socket = controller_socket or os.path.join(self.run_dir, "control.sock")
        if len(self.control_socket.encode()) > 100:
            # AF_UNIX paths are limited to 108 bytes
            self.control_socket = f"/tmp/dblp-testbed-{os.getpid()}-{uuid.uuid4().hex[:6]}.sock"
        self.tag = uuid.uuid4().hex[:6]
        self.id = f"fabric-{os.getpid()}-{self.tag}"
        self.nft_prefix = cleanup.nft_prefix(self.tag)
        self.loss_sink, self._sink_peer = cleanup.sink_pair(self.tag)
        self._machine = None  # the machine lock, held from start to stop
        self.net = None
        self.controller = None
        self.startup_s = None
        self.datapath = None
        self._popens = []
        self._state = None
        self._hosts = {}
        self._t0 = None
        self.timings = {}

    # -- lifecycle ----------------------------------------------------------
    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def _save_state(self):
        cleanup.write_state(self.id, self._state)

    def start(self):
        if self._t0 is None:  # a subclass may start the clock earlier (its own preparation)
            self._t0 = time.monotonic()
        rep = capabilities.require()
        self.datapath = ("kernel" if rep["kernel_datapath"] else "user") \
            if self.datapath_req == "auto" else self.datapath_req
        os.makedirs(self.raw_dir, exist_ok=True)
        state = {"id": self.id, "pid": os.getpid(), "owner": cleanup.owner_record(),
                 "run_dir": self.run_dir, "bridges": self.local_switches(),
                 "hosts": self.topo.hosts(), "processes": [], "links": [self.loss_sink],
                 "nft_prefix": self.nft_prefix, "files": [self.control_socket]}
        self._machine = cleanup.claim_machine(state)
        self._state = state
        # Leftovers of a fabric whose process died (SIGKILL, power loss): its
        # state file names them exactly, so they can go without asking.
        for old in cleanup.read_states():
            if old.get("id") != self.id and not cleanup.is_live(old):
                self.log(f"removing leftovers of dead fabric {old.get('id')}")
                cleanup.clean(only_state=old)
        # A stale bridge of ours from a crashed run would make add-br fail.
        stale = [b for b in cleanup.project_bridges() if b in self.topo.switch_info]
        if stale:
            raise RuntimeError(f"project bridges from an earlier run still exist ({', '.join(stale[:5])}"
                               f"...): run `dblp-testbed clean` first")

        from mininet.log import setLogLevel
        from mininet.node import RemoteController

        setLogLevel("error")
        # Below the ephemeral range: the switches' own connections cannot take it
        # before the controller binds it.
        self.of_port = free_port()
        self.net = self._new_net()
        self.net.addController(RemoteController("c0", ip=self.of_host, port=self.of_port))
        self.net.build()
        for h in self.net.hosts:
            self._hosts[h.name] = HostHandle(h.name, self.topo.host_info[h.name].ip,
                                             self.topo.host_info[h.name].mac,
                                             self.topo.host_intf(h.name), h.pid)
        self._record_shells()
        self.timings["build_s"] = time.monotonic() - self._t0

        self._make_loss_sink()
        self._configure_interfaces()
        self.timings["shaped_s"] = time.monotonic() - self._t0
        self._start_controller()
        self.net.start()
        self._shape_switch_ports()
        self.timings["switches_started_s"] = time.monotonic() - self._t0
        self._wait_routed()
        self.startup_s = time.monotonic() - self._t0
        self.log(f"{self.topo.name}: {len(self.topo.switches())} switches, {len(self.topo.hosts())} "
                 f"hosts routed in {self.startup_s:.1f} s ({self.datapath} datapath)")

    #: Where the controller listens for the switches (all on this machine here).
    of_host = "127.0.0.1"

    def _new_net(self):
        """The Mininet object, not built yet: every node on this machine."""
        from functools import partial

        from mininet.link import Link
        from mininet.net import Mininet
        from mininet.node import OVSSwitch

        switch_cls = partial(OVSSwitch, datapath=self.datapath, protocols="OpenFlow13",
                             failMode="secure")
        return Mininet(topo=_mininet_topo(self.topo), switch=switch_cls, link=Link,
                       controller=None, autoSetMacs=False, autoStaticArp=False,
                       build=False, waitConnected=False)

    def local_switches(self) -> list[str]:
        """The switches this machine runs (all of them, for a fabric on one machine)."""
        return self.topo.switches()

    def server_of(self, node: str) -> str:
        """The server that runs ``node`` (``"local"`` for every node here)."""
        return "local"

    def host_argv(self, name: str, argv) -> list[str]:
        """The argv, run here, that runs ``argv`` (a list) in host ``name``'s namespaces."""
        return ["mnexec", "-a", str(self.host(name).pid)] + list(argv)

    def root_run(self, server: str, argv, stdin: str | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` in ``server``'s root namespace (text output captured)."""
        return subprocess.run(list(argv), input=stdin, capture_output=True, text=True)

    def _record_shells(self):
        """Record every Mininet shell this process started: hosts, switches, the controller node.

        Found as this process's own children tagged ``mininet:<node>``, so a
        shell made by a build that was interrupted half-way is recorded too.
        """
        known = {r["pid"] for r in self._state["processes"]}
        nodes = [] if self.net is None else self.net.hosts + self.net.switches + self.net.controllers
        shells = [(n.pid, f"mininet:{n.name}") for n in nodes if getattr(n, "pid", None)]
        shells += [(pid, cl.rsplit(" ", 1)[-1]) for pid, cl in cleanup.own_children()]
        for pid, tag in shells:
            if tag.startswith("mininet:") and pid not in known:
                known.add(pid)
                self._state["processes"].append(cleanup.record(pid, tag))
        self._save_state()

    def _make_loss_sink(self):
        """The veth pair `loss` bursts forward their victims into (controllers.mechanisms)."""
        a, b = self.loss_sink, self._sink_peer
        for argv in (["ip", "link", "add", a, "type", "veth", "peer", "name", b],
                     ["ip", "link", "set", a, "up"], ["ip", "link", "set", b, "up"]):
            p = subprocess.run(argv, capture_output=True, text=True)
            if p.returncode:
                raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")

    def _shape_switch_ports(self):
        """After the switches started: adding a port to userspace OVS resets its qdisc."""
        if self.bw_mbps is None:
            return
        by_server: dict[str, list[str]] = {}
        for link in self.topo.links():
            for i, n in ((link.intf1(), link.node1), (link.intf2(), link.node2)):
                if self.topo.isSwitch(n):
                    by_server.setdefault(self.server_of(n), []).append(i)
        for server, sw_intfs in by_server.items():
            p = self.root_run(server, ["tc", "-force", "-batch", "-"],
                              shaping_batch(sw_intfs, self.bw_mbps, self.queue_pkts))
            if p.returncode:
                raise RuntimeError(f"shaping switch ports on {server} failed: {p.stderr.strip()[:500]}")
            shown = self.root_run(server, ["tc", "qdisc", "show"]).stdout
            shaped = {line.split(" dev ")[1].split()[0] for line in shown.splitlines()
                      if line.startswith("qdisc pfifo 10:") and " dev " in line}
            missing = [i for i in sw_intfs if i not in shaped]
            if missing:
                raise RuntimeError(f"switch ports on {server} without the bounded queue: {missing[:5]}")

    def _configure_interfaces(self):
        host_cmds = []
        servers = {self.server_of(name) for name in self._hosts}
        resolvers = {s: name_servers(self.root_run(s, ["cat", RESOLV_CONF]).stdout) for s in servers}
        for name, h in self._hosts.items():
            refused = resolvers[self.server_of(name)]
            if refused:  # the machine's name servers: unreachable from the hosts (name_servers)
                host_cmds.append((name, ["ip", "-batch", "-"],
                                  "".join(f"route replace unreachable {a}/32\n" for a in refused)))
            if self.tx_offload_off:
                host_cmds.append((name, ["ethtool", "-K", h.intf, "tx", "off"], None))
            if self.bw_mbps is not None:
                host_cmds.append((name, ["tc", "-force", "-batch", "-"],
                                  shaping_batch([h.intf], self.bw_mbps, self.queue_pkts)))
            if self.reassembly:  # per namespace: each host its own reassembly memory
                host_cmds.append((name, ["sysctl", "-q", "-w"] + [
                    f"{k}={v}" for k, v in self.reassembly.items()], None))
        procs = []
        for name, argv, stdin in host_cmds:
            procs.append((name, argv, subprocess.Popen(
                self.host_argv(name, argv), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), stdin))
        errors = []
        for name, argv, p, stdin in procs:
            out, err = p.communicate(stdin)
            if p.returncode:
                errors.append(f"{name}: {' '.join(argv)}: {err.strip()[:200]}")
        if errors:
            raise RuntimeError("configuring host interfaces failed:\n  " + "\n  ".join(errors))

    def _start_controller(self):
        cfg = {"topology": self.topo.to_dict(), "run_dir": self.run_dir,
               "control_socket": self.control_socket, "of_port": self.of_port,
               "of_host": self.of_host,
               "bw_mbps": self.bw_mbps, "queue_pkts": self.queue_pkts,
               "host_pids": {n: h.pid for n, h in self._hosts.items()},
               "bursts": self.bursts, "roles": self.roles, "loss_sink": self.loss_sink,
               "nft_prefix": self.nft_prefix,
               "monitor_s": self.monitor_s, "python": sys.executable, **self._controller_extra()}
        cfg_path = os.path.join(self.raw_dir, "fabric.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        if os.path.exists(self.control_socket):
            os.unlink(self.control_socket)
        log = open(os.path.join(self.raw_dir, "controller.stderr"), "ab")
        root = str(REPO_ROOT)
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.controller = subprocess.Popen(
            [sys.executable, "-m", "controllers.run", "--config", cfg_path],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=root)
        log.close()
        self._state["processes"].insert(0, cleanup.record(self.controller.pid, "controllers.run",
                                                          group=True))
        self._save_state()

    def _controller_extra(self) -> dict:
        """More of the controller's configuration (a fabric across machines: its other servers)."""
        return {}

    def _wait_routed(self):
        want = {str(self.topo.dpid_of(s)) for s in self.topo.switches()}
        deadline = time.monotonic() + self.ready_timeout_s
        last = None
        while time.monotonic() < deadline:
            if self.controller.poll() is not None:
                raise RuntimeError(f"controller exited with {self.controller.returncode}; see "
                                   f"{os.path.join(self.raw_dir, 'controller.stderr')}")
            try:
                with ControlClient(self.control_socket, timeout=5) as client:
                    st = client.send(StatusRequest())
                if st.ok:
                    last = st
                    ready = {d for d, s in st.switches.items() if s.routed}
                    if want <= ready:
                        return
            except (OSError, ValueError):  # not listening yet; ProtocolError is a ValueError
                pass
            time.sleep(0.1)
        n = last.routed if last is not None else 0
        raise TimeoutError(f"only {n}/{len(want)} switches routed after {self.ready_timeout_s} s "
                           f"(ready_timeout_s); see {self.raw_dir}/controller.log")

    def unit_begin(self):
        """What a unit's end compares with, for the other machines' fields (none here)."""
        return None

    def unit_fidelity(self, begun, window=None) -> dict:
        """A unit's fidelity fields for the other machines and the links to them (none here).

        ``window``: the unit's rounds (time_ns bounds), as the CPU figures here use.
        """
        return {}

    def collect(self) -> None:
        """Bring the run's files written on other machines here (none: every host is here)."""

    def stop(self):
        """Tear down what this fabric created; safe to call twice."""
        if self._state is None:
            return
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) \
            if signal.getsignal(signal.SIGINT) is not None else None
        try:
            for p in self._popens:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGTERM)
                    except (ProcessLookupError, PermissionError):
                        pass
            for p in self._popens:
                try:
                    p.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    p.wait()
            if self.controller is not None and self.controller.poll() is None:
                try:
                    os.killpg(self.controller.pid, signal.SIGTERM)
                    self.controller.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.killpg(self.controller.pid, signal.SIGKILL)
                    self.controller.wait()
                except ProcessLookupError:
                    pass
            self._record_shells()
            if self.net is not None:
                try:
                    self.net.stop()
                except Exception as e:  # fall through to the name-based clean-up
                    self.log(f"mininet stop failed ({type(e).__name__}: {e}); cleaning by name")
            cleanup.clean(only_state=self._state)
            self._state = None
        finally:
            cleanup.release_machine(self._machine)
            self._machine = None
            if old is not None:
                signal.signal(signal.SIGINT, old)

    # -- hosts and commands -------------------------------------------------
    def host(self, name) -> HostHandle:
        if name not in self._hosts:
            raise KeyError(f"no host {name!r} in {self.topo.name}; "
                           f"hosts: {', '.join(sorted(self._hosts)[:8])}...")
        return self._hosts[name]

    def hosts(self):
        return sorted(self._hosts)

    def ip(self, name) -> str:
        return self.host(name).ip

    def intf(self, name) -> str:
        return self.host(name).intf

    def role(self, name):
        if name not in self.roles:
            raise KeyError(f"no role {name!r}; roles: {sorted(self.roles)}")
        return self.roles[name]

    @property
    def server(self):
        return self.roles["server"]

    @property
    def workers(self):
        return list(self.roles["workers"])

    def place(self, n_workers):
        return self.topo.place(n_workers)

    def popen(self, host, argv, **kw) -> subprocess.Popen:
        """Start ``argv`` (a list) inside a host's namespaces; tracked for teardown."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of str (no shell strings)")
        argv = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv]
        if not all(isinstance(a, str) for a in argv):
            raise TypeError("argv must be a list of str or paths (no shell strings)")
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.host_argv(host, argv), **kw)
        self._popens.append(p)
        if self._state is not None:
            self._state["processes"].append(cleanup.record(p.pid, argv[0], group=True))
            self._save_state()
        return p

    def adopt(self, proc: subprocess.Popen, tag: str) -> None:
        """Track ``proc``, started here in this machine's namespaces as its own process
        group's leader, as `popen` tracks what it starts: teardown and clean-up end its group."""
        self._popens.append(proc)
        if self._state is not None:
            self._state["processes"].append(cleanup.record(proc.pid, tag, group=True))
            self._save_state()

    def run(self, host, argv, timeout=None, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` in a host to completion (text output captured by default)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of str (no shell strings)")
        return subprocess.run(self.host_argv(host, argv), timeout=timeout, **kw)

    def control(self, request: dict, timeout: float = 10.0) -> dict:
        """One request, written as its JSON object, on a fresh connection; the reply as one."""
        with ControlClient(self.control_socket, timeout) as client:
            return client.request(request)

