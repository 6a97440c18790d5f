"""Mininet's cluster edition's remote nodes and links, extended where this project needs more.

The cluster edition (``mininet.examples.cluster``, shipped in Debian's
``mininet``) runs each remote node's shell over ssh (``RemoteMixin``), starts
remote switches per server in batches (``RemoteOVSSwitch``) and builds a
link between servers as a tunnel (``RemoteLink``). What changes here, and why:

- **ssh** (`ProjectRemote`): the project's own ssh command for every server
  (`testbed.emulation.cluster.nodes.SshPlan`: ``BatchMode``, a bounded
  connect, the server's port, the spec's options such as ``-i KEY``), all
  sessions to one server over one multiplexed connection (``ControlMaster``,
  its socket in a directory of this fabric's), and no ``sudo`` where the
  login is root. The cluster edition wraps ssh in ``sudo -E -u USER`` here
  and every remote command in ``sudo -E`` there; a lab machine logged into
  as root needs neither, and this machine may not have sudo at all.
- **No ``mn -c``**: the cluster edition registers a clean-up that runs
  ``sudo mn -c`` on every server, which deletes every OVS bridge and stops
  every Mininet there, the project's or not. Nodes made here take their
  server out of that list; each server's own agent
  (`testbed.emulation.cluster.agent`) removes only what this fabric made.
- **Switches** (`ClusterSwitch`): each server's batch of ``ovs-vsctl`` run
  as a command of its own, not typed into a shell.
- **Tunnels** (`VxlanLink`): a link between servers is a VXLAN device on
  each (one VNI per link), added to the switch like any other port, where
  the cluster edition uses an ssh tunnel (a TCP stream per link, through
  user space) or GRE (which this kernel lacks). A VXLAN device is the
  kernel's own encapsulation, so its end is shaped by the same HTB and
  pfifo as every other switch port, and its counters are the port's.

Importing this module imports Mininet, which only a machine that builds a
fabric needs: `testbed.emulation.cluster.fabric` imports it when it builds
one, and what needs no Mininet (the ssh plan, the tunnel's numbers) is in
`testbed.emulation.cluster.nodes`. As Mininet's own ``Mininet(topo,
host=, switch=, link=)`` takes its node classes, ``MininetCluster`` takes
these, chosen by `node_classes`.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from typing import NamedTuple

from mininet.examples import cluster
from mininet.link import Link
from mininet.node import Node, OVSSwitch

from testbed.emulation.cluster.nodes import FABRIC_MTU, VXLAN_PORT, SshPlan


def _by_server(nodes) -> list[tuple]:
    """``nodes`` grouped by their server, each group in the given order."""
    groups: dict[str, list] = {}
    for n in nodes:
        groups.setdefault(n.server, []).append(n)
    return [tuple(g) for g in groups.values()]


class ProjectRemote(cluster.RemoteMixin):
    """A cluster-edition node whose ssh is the project's (`SshPlan`) and never runs ``mn -c``."""

    def __init__(self, name, ssh: SshPlan | None = None, **kwargs):
        if ssh is None:
            raise TypeError(f"{name}: a cluster node needs the fabric's SshPlan (ssh=...)")
        self.ssh = ssh
        server = kwargs.get("server") or "localhost"
        kwargs.setdefault("user", ssh.servers[server].user or "root" if server in ssh.servers
                          and not ssh.servers[server].is_local else None)
        super().__init__(name, **kwargs)
        # The cluster edition's clean-up would run `mn -c` on this server.
        cluster.ClusterCleanup.serveruser.pop(self.server, None)

    def _popen(self, cmd, sudo=True, tt=True, **params):
        if isinstance(cmd, str):
            cmd = cmd.split()
        if self.isRemote:
            cmd = self.ssh.command(self.server, [str(c) for c in cmd], root=sudo, tty=tt)
        params.update(preexec_fn=os.setpgrp)
        return Node._popen(self, cmd, **params)


class ClusterHost(ProjectRemote, cluster.RemoteHost):
    """A host on any server."""


class ClusterSwitch(ProjectRemote, cluster.RemoteOVSSwitch):
    """An OVS switch on any server, started and stopped in one batch per server.

    The cluster edition types each batch's ``ovs-vsctl`` line into the
    first switch's shell, whose terminal cuts a line at 4,095 bytes: a
    server with ten switches got half a command ("argument does not end
    in '='") and no bridges. Here the line is run as a command of its
    own: through ``sh`` here, as ssh's command there.
    """

    def shell_run(self, cmd: str, **_kwargs):
        if self.isRemote:
            argv = self.ssh.command(self.server, ["sh", "-c", cmd])
        else:
            argv = ["sh", "-c", cmd]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if p.returncode:
            raise RuntimeError(f"{self.server}: {cmd[:120]}...: {p.stderr.strip()[-300:]}")
        return p.stdout, p.stderr, p.returncode

    @classmethod
    def batchStartup(cls, switches, **_kwargs):
        for group in _by_server(switches):
            OVSSwitch.batchStartup(group, run=group[0].shell_run)
        return switches

    @classmethod
    def batchShutdown(cls, switches, **_kwargs):
        for group in _by_server(switches):
            OVSSwitch.batchShutdown(group, run=group[0].shell_run)
        return switches


class VxlanLink(cluster.RemoteLink):
    """A link: a veth pair on one server, a VXLAN device at each end across two.

    ``vni``: the link's own VXLAN network identifier (the fabric numbers
    the crossing links); ``endpoints``: each server's tunnel address
    (cluster-edition name -> IPv4), the one the other servers reach it at.
    """

    def __init__(self, node1, node2, vni: int = 0, endpoints: Mapping[str, str] | None = None,
                 **kwargs):
        self.vni, self.endpoints = vni, dict(endpoints or {})
        super().__init__(node1, node2, **kwargs)

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None, node1=None,
                     node2=None, deleteIntfs=True):
        node1 = self.node1 if node1 is None else node1
        node2 = self.node2 if node2 is None else node2
        if getattr(node1, "server", "localhost") == getattr(node2, "server", "localhost"):
            return Link.makeIntfPair(intfname1, intfname2, addr1, addr2, node1, node2,
                                     deleteIntfs=deleteIntfs)
        self.makeTunnel(node1, node2, intfname1, intfname2, addr1, addr2)
        self.tunnel = self.vni
        return None

    def makeTunnel(self, node1, node2, intfname1, intfname2, addr1=None, addr2=None):
        if not self.vni:
            raise ValueError(f"{node1}-{node2}: a link between servers needs its VNI")
        ends = ((node1, intfname1, addr1, node1.server, node2.server),
                (node2, intfname2, addr2, node2.server, node1.server))
        for node, name, addr, here, there in ends:
            words = ["ip", "link", "add", name, "mtu", str(FABRIC_MTU)]
            if addr:
                words += ["address", addr]
            words += ["type", "vxlan", "id", str(self.vni), "local", self.endpoints[here],
                      "remote", self.endpoints[there], "dstport", str(VXLAN_PORT)]
            for argv in (words, ["ip", "link", "set", name, "up"]):
                p = node.rpopen(argv, tt=False)
                out = p.communicate()[0]
                if p.returncode:
                    raise RuntimeError(f"{node} on {node.server}: {' '.join(argv)}: "
                                       f"{out.decode(errors='replace').strip()}")
        return None

    def stop(self):
        if self.tunnel:
            self.intf1.delete()
            self.intf2.delete()
        else:
            Link.stop(self)
        self.tunnel = None

    def status(self):
        return f"{Link.status(self)} VXLAN {self.vni}" if self.tunnel else Link.status(self)


class NodeClasses(NamedTuple):
    """The classes ``MininetCluster`` builds a fabric's nodes and links from."""

    host: type
    switch: type
    link: type


def node_classes() -> NodeClasses:
    """(host class, switch class, link class) for ``MininetCluster``: the fabric binds each
    to its ssh plan, datapath and tunnel ends, and passes them in."""
    return NodeClasses(host=ClusterHost, switch=ClusterSwitch, link=VxlanLink)
