"""One fabric across several machines: `ClusterFabric`, a `Fabric` on Mininet's cluster edition.

Use, as a `Fabric`, with the servers added::

    with ClusterFabric(FatTreeTopo(4), run_dir=RUN, servers=["local", "root@lab2"],
                       ssh_options=["-i", KEY], bw_mbps=20) as fab:
        fab.placement["h300"]     # "root@lab2": where each node runs
        fab.crossing              # the links between machines (VXLAN), with their VNIs
        fab.run("h300", ["ping", "-c1", fab.ip("h000")])   # on lab2, in h300's namespaces
        fab.tunnel_counters()     # bytes through each tunnel end, inner and outer

What happens beyond a `Fabric`'s start, in order: the preflight
(`preflight.preflight`: every server reachable, set up, at this revision,
with OVS, and every pair of servers reaching each other, or one line naming
which and why); an agent on each further server (`agent`), which claims that
machine and will remove what this fabric makes there even if this machine
dies; the placement (`placement.place_pods`: whole pods per server, so only
core links cross); the cluster edition builds the nodes over one
multiplexed ssh connection per server (`nodes.SshPlan`), each crossing link
a VXLAN device at each end (`remote.VxlanLink`); the controller listens on
this machine's address towards the others, so every switch of every server
connects to it; every switch port, tunnel ends included, is shaped on its
own server. At the end each agent is told to stop and answers with what it
removed; the fabric's ``cleanup_report`` holds those answers per server.

Runs (``dblp-testbed run``) use it as any `Fabric`: commands on another
server go through its ssh connection into the host's namespaces, and a
burst's hooks on another server's ports through the nft agent the
controller starts there (docs/cluster.md, "Runs across machines").
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence

from testbed.config.servers import LOCAL, Server, check_ssh_options
from testbed.emulation.cleanup import STATE_DIR
from testbed.emulation.cluster.agent import ENV_WRAPPER
from testbed.emulation.cluster.nodes import VXLAN_OVERHEAD, SshPlan
from testbed.emulation.cluster.placement import mininet_placer
from testbed.emulation.cluster.preflight import CONNECT_TIMEOUT_S, local_address_towards, preflight
from testbed.emulation.fabric import Fabric, _mininet_topo
from testbed.errors import MachineError
from topologies import TopoGraph
from topologies.placement import crossing_links, place_pods

#: The cluster edition's name for this machine.
HERE = "localhost"
#: ssh sessions to a server beyond its nodes' shells: the agent, and the
#: commands run in its hosts at once (workers, captures, probes).
SPARE_SESSIONS = 24
#: The first VXLAN network identifier; crossing link i gets FIRST_VNI + i.
FIRST_VNI = 4200


class RemoteAgent:
    """The agent on one remote server (`testbed.emulation.cluster.agent`), over its own ssh session."""

    def __init__(self, server: Server, ssh: SshPlan, name: str, project_dir: str):
        self.server = server
        python = os.path.join(project_dir, ".venv", "bin", "python")
        argv = ssh.command(name, ["env", f"PYTHONPATH={project_dir}", python, "-m",
                                  "testbed.emulation.cluster.agent"])
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1,
                                     start_new_session=True, cwd=project_dir)
        self.lock = threading.Lock()
        first = self._line(timeout_s=ssh.connect_timeout_s + 20)
        if not first.get("ok"):
            raise MachineError(f"cluster server {server.name!r}: its agent did not start "
                               f"({first.get('error', 'no answer')})")

    def _line(self, timeout_s: float = 60) -> dict:
        assert self.proc.stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not result or not result[0]:
            err = ""
            if self.proc.poll() is not None and self.proc.stderr is not None:
                err = self.proc.stderr.read().strip().splitlines()[-1:] or ""
            return {"ok": False, "error": f"no answer within {timeout_s:g} s"
                    + (f": {err[0]}" if err else "")}
        return json.loads(result[0])

    def request(self, req: dict, timeout_s: float = 60) -> dict:
        with self.lock:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps(req) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                return {"ok": False, "error": "the agent's ssh session ended"}
            return self._line(timeout_s)

    def call(self, req: dict, timeout_s: float = 60) -> dict:
        """``request``, raising a `MachineError` that names the server when it fails."""
        reply = self.request(req, timeout_s)
        if not reply.get("ok"):
            raise MachineError(f"cluster server {self.server.name!r}: {req.get('op')}: "
                               f"{reply.get('error')}")
        return reply

    def stop(self) -> dict:
        reply = self.request({"op": "stop"}, timeout_s=60) if self.proc.poll() is None else \
            {"ok": False, "error": "the agent had already exited"}
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            self.proc.wait()
        return reply


class MachinesCpu:
    """The other servers' ``/proc/stat`` every half second through a unit, read by their agents.

    Why sampled, not read at the unit's two ends: the figures are judged over
    the unit's rounds only, as this machine's are (`testbed.run.budget.UnitCpu`),
    and the rounds' bounds are known only after the unit.
    """

    PERIOD_S = 0.5

    def __init__(self, agents: dict[str, RemoteAgent]):
        self.agents = dict(agents)
        self.samples: dict[str, list[tuple[int, list[int]]]] = {n: [] for n in self.agents}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            for name, agent in self.agents.items():
                reply = agent.request({"op": "run", "argv": ["head", "-1", "/proc/stat"]}, timeout_s=10)
                if reply.get("ok") and reply.get("rc") == 0:
                    self.samples[name].append((time.time_ns(), [int(x) for x in reply["out"].split()[1:]]))
            if self.done.wait(self.PERIOD_S):
                return

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=15)

    def fractions(self, window) -> dict[str, dict]:
        """Server -> busy and steal fractions between the first and last samples inside ``window``."""
        out = {}
        for name, samples in self.samples.items():
            inside = [s for s in samples if window[0] <= s[0] <= window[1]]
            pick = inside if len(inside) >= 2 else samples
            if len(pick) < 2:
                continue
            d = [b - a for a, b in zip(pick[0][1], pick[-1][1], strict=False)]
            total = sum(d)
            out[name] = {"busy_frac": round(1 - (d[3] + d[4]) / total, 3) if total else 0.0,
                         "steal_frac": round(d[7] / total, 3) if total and len(d) > 7 else 0.0,
                         "window_s": round((pick[-1][0] - pick[0][0]) / 1e9, 2)}
        return out


class ClusterFabric(Fabric):
    """A `Fabric` whose nodes run on several servers, pods kept whole; only core links cross."""

    def __init__(self, topo: TopoGraph, run_dir: str, servers: Sequence[str] = (LOCAL,),
                 ssh_options: Sequence[str] = (), connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 project_dir: str | None = None, **kwargs):
        super().__init__(topo, run_dir, **kwargs)
        from testbed import REPO_ROOT

        self.server_names = list(servers)
        check_ssh_options(ssh_options)
        self.ssh_options = list(ssh_options)
        self.connect_timeout_s = connect_timeout_s
        self.project_dir = project_dir or str(REPO_ROOT)
        # The cluster edition's names: this machine is "localhost", the others as the spec names them.
        self.placement = {n: s if s != HERE else LOCAL
                          for n, s in place_pods(topo, [HERE, *self.server_names[1:]]).items()}
        self.crossing = {(link.node1, link.node2): FIRST_VNI + i
                         for i, link in enumerate(crossing_links(topo, self.placement))}
        self.agents: dict[str, RemoteAgent] = {}
        self.ssh: SshPlan | None = None
        self.endpoints: dict[str, str] = {}
        self.cleanup_report: dict[str, dict] = {}
        self.clocks: dict[str, dict] = {}

    # -- where things run ----------------------------------------------------------------
    def server_of(self, node: str) -> str:
        return self.placement[node]

    def local_switches(self) -> list[str]:
        return [s for s in self.topo.switches() if self.placement[s] == LOCAL]

    def _cluster_name(self, server: str) -> str:
        return HERE if server == LOCAL else server

    def host_argv(self, name: str, argv) -> list[str]:
        server = self.placement[name]
        words = ["mnexec", "-a", str(self.host(name).pid)] + [str(a) for a in argv]
        if server == LOCAL:
            return words
        assert self.ssh is not None
        return self.ssh.command(server, words)

    def popen(self, host, argv, **kw) -> subprocess.Popen:
        if self.placement[host] != LOCAL:
            argv, kw = self._remote_command(host, list(argv), kw)
        return super().popen(host, argv, **kw)

    def run(self, host, argv, timeout=None, **kw) -> subprocess.CompletedProcess:
        if self.placement[host] != LOCAL:
            argv, kw = self._remote_command(host, list(argv), kw)
        return super().run(host, argv, timeout=timeout, **kw)

    def _remote_command(self, host: str, argv: list, kw: dict) -> tuple[list, dict]:
        """``argv`` and Popen's keywords for a host on another server.

        ssh carries neither the environment nor the working folder, so what
        the caller set (the variables that differ from this process's) goes
        to the server's agent over its ssh session's standard input, which
        writes it into a file only root reads (`agent.Agent.envfile`); the
        command sources and removes that file before it starts
        (`agent.ENV_WRAPPER`). Why not ``env NAME=VALUE`` words: they would be
        ssh's argv here and the remote shell's there, readable by every user
        in ``/proc/PID/cmdline`` for the command's life, and the job's secret
        (``DBLP_SECRET``) is one of them. ``cwd`` goes as a ``cd``. The
        fabric's control socket is this machine's: a process there cannot
        reach it, so it is not passed. The run's files the command names
        (``PATH`` or ``--option=PATH`` under the run directory) get their
        folders there, those that exist here are copied there (`push`), and
        what it writes comes back with `collect`.
        """
        kw = dict(kw)
        env = kw.pop("env", None) or {}
        cwd = kw.pop("cwd", None)
        own = {str(k): str(v) for k, v in env.items()
               if os.environ.get(k) != v and v != str(self.control_socket)}
        words = [str(a) for a in argv]
        paths = [p for w in words for p in (w, w.split("=", 1)[-1])
                 if p.startswith(self.run_dir + os.sep)]
        server = self.placement[host]
        if paths:
            self.agents[server].call({"op": "mkdir", "paths": sorted({os.path.dirname(p) for p in paths}),
                                      "under": self.run_dir})
            self.push(server, [p for p in paths if os.path.isfile(p)])
        if cwd is not None:
            words = ["sh", "-c", 'cd "$0" && exec "$@"', str(cwd), *words]
        if own:
            path = self.agents[server].call({"op": "envfile", "env": own})["path"]
            words = ["sh", "-c", ENV_WRAPPER, path, *words]
        return words, kw

    def push(self, server: str, paths: Sequence[str]) -> None:
        """Files of this run that a command on ``server`` reads (its configuration), copied there."""
        if not paths:
            return
        assert self.ssh is not None
        rel = [os.path.relpath(p, self.run_dir) for p in paths]
        send = subprocess.Popen(["tar", "-C", self.run_dir, "-c", "--", *rel], stdout=subprocess.PIPE)
        got = subprocess.run(self.ssh.command(server, ["tar", "-C", self.run_dir, "-x"]), stdin=send.stdout,
                             capture_output=True, text=True, timeout=60)
        send.wait()
        if got.returncode:
            raise MachineError(f"cluster server {server!r}: copying {', '.join(rel)} there failed: "
                               f"{got.stderr.strip()[-200:]}")

    def collect(self) -> None:
        """This run's files written on the other servers, copied into the run directory here.

        A file copied before (a capture still being written) is copied again
        when it changed since; one written here is kept (a name is one
        role's, written on one server).
        """
        for name in self.agents:
            assert self.ssh is not None
            script = 'test -d "$0" || exit 0; exec tar -C "$0" -c .'
            sent = subprocess.run(self.ssh.command(name, ["sh", "-c", script, self.run_dir]),
                                  capture_output=True, timeout=600)
            if not sent.stdout:  # nothing of this run was written there
                continue
            got = subprocess.run(["tar", "-C", self.run_dir, "-x", "--keep-newer-files"], input=sent.stdout,
                                 capture_output=True)
            if got.returncode:
                self.log(f"collecting {name}'s files: {got.stderr.decode(errors='replace').strip()[-200:]}")

    def root_run(self, server: str, argv, stdin: str | None = None) -> subprocess.CompletedProcess:
        if server == LOCAL:
            return super().root_run(server, argv, stdin)
        reply = self.agents[server].call({"op": "run", "argv": list(argv), "input": stdin})
        return subprocess.CompletedProcess(list(argv), reply["rc"], reply["out"], reply["err"])

    # -- start and stop ---------------------------------------------------------------------
    def start(self):
        self._t0 = t0 = time.monotonic()  # startup_s counts the preflight and the agents too
        # A session per node placed there, the agent, and the commands run there at once.
        sessions = {name: sum(1 for where in self.placement.values() if where == name)
                    + SPARE_SESSIONS for name in self.server_names[1:]}
        parsed = preflight(self.server_names, self.project_dir, self.connect_timeout_s,
                           self.ssh_options, sessions)
        self.timings["preflight_s"] = time.monotonic() - t0
        servers = {self._cluster_name(s.name): s for s in parsed}
        control_dir = os.path.join(STATE_DIR, f"ssh-{self.tag}")
        os.makedirs(control_dir, mode=0o700, exist_ok=True)
        self.ssh = SshPlan(servers, tuple(self.ssh_options), control_dir, self.connect_timeout_s)
        towards = [s for s in parsed if not s.is_local]
        here = local_address_towards(towards[0]) if towards else "127.0.0.1"
        if not here:
            raise MachineError(f"cluster server {towards[0].name!r}: no route from this machine")
        self.endpoints = {HERE: here, **{s.name: _address(s) for s in towards}}
        self.of_host = here
        for s in towards:
            names = [n for n, where in self.placement.items() if where == s.name]
            agent = RemoteAgent(s, self.ssh, s.name, self.project_dir)
            self.agents[s.name] = agent
            agent.call({"op": "claim", "state": {
                "id": self.id, "run_dir": f"{s.name}: part of {self.run_dir} on the first server",
                "bridges": [n for n in names if self.topo.isSwitch(n)], "links": [],
                "hosts": [n for n in names if not self.topo.isSwitch(n)]}})
        self.timings["agents_s"] = time.monotonic() - t0
        self.clocks = {name: clock_offset(agent) for name, agent in self.agents.items()}
        super().start()
        for name, agent in self.agents.items():
            found = agent.call({"op": "record", "shells": True})["shells"]
            placed = sum(1 for where in self.placement.values() if where == name)
            if found < placed:  # what the agent did not adopt, it would not remove
                raise MachineError(f"cluster server {name!r}: its agent found {found} of the {placed} "
                                   f"node shells this fabric started there over its ssh connection")

    def _new_net(self):
        from functools import partial

        from mininet.examples.cluster import MininetCluster

        from testbed.emulation.cluster.remote import node_classes

        host_cls, switch_cls, link_cls = node_classes()
        topo = _mininet_topo(self.topo)
        _add_vnis(topo, self.crossing)
        return MininetCluster(
            topo=topo, servers=[HERE, *self.server_names[1:]],
            serverIP={HERE: self.endpoints[HERE], **{n: ip for n, ip in self.endpoints.items() if n != HERE}},
            placement=mininet_placer(self.topo, local=HERE), precheck=False,
            host=partial(host_cls, ssh=self.ssh),
            switch=partial(switch_cls, ssh=self.ssh, datapath=self.datapath,
                           protocols="OpenFlow13", failMode="secure"),
            link=partial(link_cls, endpoints=self.endpoints),
            controller=None, autoSetMacs=False, autoStaticArp=False, build=False,
            waitConnected=False)

    def _make_loss_sink(self):
        """The loss sink on every server: a burst there forwards its victims into its own."""
        super()._make_loss_sink()
        a, b = self.loss_sink, self._sink_peer
        for name, agent in self.agents.items():
            agent.call({"op": "record", "links": [a, b]})
            for argv in (["ip", "link", "add", a, "type", "veth", "peer", "name", b],
                         ["ip", "link", "set", a, "up"], ["ip", "link", "set", b, "up"]):
                p = self.root_run(name, argv)
                if p.returncode:
                    raise MachineError(f"cluster server {name!r}: {' '.join(argv)}: {p.stderr.strip()}")

    def _controller_extra(self) -> dict:
        """How the controller reaches the other servers: an nft agent on each for their ports
        (loss rules, queue counters), and how to start a cross-traffic agent in each host there;
        and the only remote addresses its OpenFlow port accepts (`peer_addresses`)."""
        assert self.ssh is not None
        python = os.path.join(self.project_dir, ".venv", "bin", "python")
        env = ["env", f"PYTHONPATH={self.project_dir}", python, "-m"]
        agent = [*env, "controllers.nft_agent", "--prefix", self.nft_prefix]
        cross = {h: self.ssh.command(where, ["mnexec", "-a", str(self.host(h).pid), *env,
                                             "controllers.crosstraffic", "--agent"])
                 for h, where in self.placement.items() if where != LOCAL and not self.topo.isSwitch(h)}
        return {"of_peer_addrs": self.peer_addresses(),
                "remote": {"servers": {name: self.ssh.command(name, agent) for name in self.agents},
                           "switches": {sw: where for sw, where in self.placement.items()
                                        if where != LOCAL and self.topo.isSwitch(sw)},
                           "cross_agents": cross}}

    def peer_addresses(self) -> list[str]:
        """Where the other servers' switches connect to the controller from.

        Why both: each server's address as named (``endpoints``) and the source
        address its own routing picks towards the controller (``ip route get``
        there), which differs on a machine with several addresses. The
        controller refuses any other remote peer (``controllers.ofchannel``).
        """
        addrs = set()
        for name in self.agents:
            addrs.add(self.endpoints[name])
            p = self.root_run(name, ["ip", "-o", "route", "get", self.of_host])
            words = p.stdout.split()
            if p.returncode == 0 and "src" in words[:-1]:
                addrs.add(words[words.index("src") + 1])
        return sorted(addrs)

    def stop(self):
        try:
            super().stop()
            if self.agents:
                self.collect()
        finally:
            for name, agent in list(self.agents.items()):
                reply = agent.stop()
                self.cleanup_report[name] = reply.get("removed", {"error": reply.get("error")})
            self.agents = {}
            if self.ssh is not None:
                self.ssh.close()
                # A master that outlived ``close`` (ControlPersist) leaves its socket: ours alone.
                shutil.rmtree(self.ssh.control_dir, ignore_errors=True)

    # -- what the tunnels carried ------------------------------------------------------------
    def tunnel_counters(self) -> list[dict]:
        """Per crossing link, each end's transmitted and received bytes and packets (inner frames).

        Read on the server that holds each end (``ip -s -j link``): the
        switch port's own counters, so what HTB let through. The outer
        bytes on the machines' network add `VXLAN_OVERHEAD` per packet.
        """
        out = []
        for link in crossing_links(self.topo, self.placement):
            ends = []
            for node, intf in ((link.node1, link.intf1()), (link.node2, link.intf2())):
                server = self.placement[node]
                p = self.root_run(server, ["ip", "-s", "-j", "link", "show", "dev", intf])
                stats = json.loads(p.stdout or "[{}]")[0].get("stats64", {})
                ends.append({"server": server, "intf": intf,
                             "tx_bytes": stats.get("tx", {}).get("bytes", 0),
                             "tx_packets": stats.get("tx", {}).get("packets", 0),
                             "rx_bytes": stats.get("rx", {}).get("bytes", 0),
                             "rx_packets": stats.get("rx", {}).get("packets", 0)})
            out.append({"link": f"{link.node1}-{link.node2}", "vni": self.crossing[link.node1, link.node2],
                        "ends": ends})
        return out

    def unit_begin(self):
        """A unit's start: the tunnels' counters, and the other servers' CPU sampled from now on."""
        return time.monotonic(), self.tunnel_counters(), MachinesCpu(self.agents)

    def unit_fidelity(self, begun, window=None) -> dict:
        """What the other machines did and the crossing links carried during a unit.

        ``others_cpu_busy_frac``/``others_cpu_steal_frac``: the busiest other
        server's CPU busy and steal fractions over the unit's rounds
        (``window``), judged by the same invariants as this machine's
        (`testbed.invariants`), and ``servers_cpu``, each server's.
        ``tunnel_bytes``/``tunnel_packets``: inner frames sent into the
        tunnels (both ends, both ways); ``tunnel_overhead_frac``: the bytes
        VXLAN added on the machines' network per byte carried (50 per frame);
        ``tunnel_busiest_mbps``: the busiest tunnel direction's mean rate over
        the unit, beside ``tunnel_shaped_mbps``, the rate every link is
        shaped to. Called again without a window (the unit's end, whatever
        happened), it only stops the sampling.
        """
        if begun is None:
            return {}
        t0, first, cpu = begun
        cpu.stop()
        if window is None:
            return {}
        t1, last = time.monotonic(), self.tunnel_counters()
        sent, packets, busiest = 0, 0, 0.0
        for a, b in zip(first, last, strict=True):
            for e0, e1 in zip(a["ends"], b["ends"], strict=True):
                d = e1["tx_bytes"] - e0["tx_bytes"]
                sent += d
                packets += e1["tx_packets"] - e0["tx_packets"]
                busiest = max(busiest, d * 8 / max(t1 - t0, 1e-9) / 1e6)
        per = cpu.fractions(window)
        return {"tunnel_bytes": sent, "tunnel_packets": packets,
                "tunnel_overhead_frac": round(packets * VXLAN_OVERHEAD / sent, 4) if sent else None,
                "tunnel_busiest_mbps": round(busiest, 3), "tunnel_shaped_mbps": self.bw_mbps,
                "servers_cpu": per,
                "others_cpu_busy_frac": max((f["busy_frac"] for f in per.values()), default=None),
                "others_cpu_steal_frac": max((f["steal_frac"] for f in per.values()), default=None)}

    def fidelity(self) -> dict:
        """What the fidelity record says of the machines: servers, placement sizes, the tunnels."""
        per = {s: {"switches": 0, "hosts": 0} for s in self.server_names}
        for node, server in self.placement.items():
            per[server]["switches" if self.topo.isSwitch(node) else "hosts"] += 1
        return {"servers": self.server_names, "per_server": per, "endpoints": {
                    (LOCAL if k == HERE else k): v for k, v in self.endpoints.items()},
                "crossing_links": len(self.crossing), "tunnel": "vxlan", "clocks": self.clocks,
                "tunnel_overhead_bytes": VXLAN_OVERHEAD, "timings_s": dict(self.timings)}


def clock_offset(agent: RemoteAgent, tries: int = 5) -> dict:
    """How far ``agent``'s machine's clock is ahead of this one's, by the quickest of a few asks.

    Each ask is bracketed by this clock; the offset is the remote time minus
    the bracket's middle, uncertain by half its round trip (``rtt_ms``).
    Recorded, not applied: every join the analysis makes is on one machine's
    clock (rank 0's, this one) so far (docs/cluster.md).
    """
    best: tuple[int, int] | None = None
    for _ in range(tries):
        t0 = time.time_ns()
        reply = agent.call({"op": "time"})
        t1 = time.time_ns()
        sample = (t1 - t0, reply["time_ns"] - (t0 + t1) // 2)
        if best is None or sample[0] < best[0]:
            best = sample
    assert best is not None
    return {"offset_ms": round(best[1] / 1e6, 3), "rtt_ms": round(best[0] / 1e6, 3)}


def local_first(topo: TopoGraph, servers: Sequence[str], workers: list[str]) -> list[str]:
    """The workers, those on this machine first (stable otherwise).

    Rank 0 announces each round to the controller (round-locked bursts)
    through a socket on this machine, so rank 0 must run here.
    """
    placement = place_pods(topo, [HERE, *servers[1:]])
    return sorted(workers, key=lambda h: placement[h] != HERE)


def _address(server: Server) -> str:
    import socket

    try:
        return socket.gethostbyname(server.host)
    except OSError as exc:
        raise MachineError(f"cluster server {server.name!r}: {server.host} does not resolve ({exc})") \
            from None


def _add_vnis(topo, crossing: dict) -> None:
    """Give each crossing link of the Mininet topology its VNI (a link option, for `VxlanLink`)."""
    for a, b, key, info in topo.links(sort=True, withKeys=True, withInfo=True):
        vni = crossing.get((info["node1"], info["node2"])) or crossing.get((info["node2"], info["node1"]))
        if vni:
            topo.setlinkInfo(a, b, dict(info, vni=vni), key)

