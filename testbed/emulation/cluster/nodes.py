"""What the cluster edition's nodes need without Mininet: their ssh, and the tunnel's numbers.

The node classes themselves (`testbed.emulation.cluster.remote`: hosts,
switches and VXLAN links on Mininet's cluster edition) import Mininet, which
only a machine that builds a fabric needs; the fabric's bookkeeping, the
preflight and the tests need only these:

- `SshPlan`: the project's own ssh command for every server
  (`Server.ssh_argv`: ``BatchMode``, a bounded connect, the server's port,
  the spec's options such as ``-i KEY``), all sessions to one server over
  one multiplexed connection (``ControlMaster``, its socket in a directory
  of this fabric's), and no ``sudo`` where the login is root;
- the tunnel's numbers: a link between servers is a VXLAN device on each
  end (`VXLAN_PORT`), whose frames carry `VXLAN_OVERHEAD` bytes more than
  the fabric's (`FABRIC_MTU`) on the machines' network.
"""
from __future__ import annotations

import dataclasses
import shlex
import subprocess
from collections.abc import Mapping, Sequence

from testbed.config.servers import Server

#: VXLAN's IANA port; each link has its own VNI, so they share it.
VXLAN_PORT = 4789
#: The encapsulation a VXLAN frame carries over the machines' network: outer
#: IPv4 (20) + UDP (8) + VXLAN (8) + the inner Ethernet header (14).
VXLAN_OVERHEAD = 50
#: The fabric's frames stay at this MTU inside the tunnel (the hosts' MTU).
FABRIC_MTU = 1500


@dataclasses.dataclass(frozen=True)
class SshPlan:
    """How every node reaches its server: the spec's servers by cluster-edition name, ssh's options."""

    servers: Mapping[str, Server]
    options: Sequence[str] = ()
    control_dir: str = ""
    connect_timeout_s: float = 5.0

    def argv(self, server: str, tty: bool = False) -> list[str]:
        """ssh to ``server``, ending with ``--`` and the destination (the command comes next)."""
        own = []
        if self.control_dir:
            own += ["-o", f"ControlPath={self.control_dir}/%C", "-o", "ControlMaster=auto",
                    "-o", "ControlPersist=30"]
        if tty:
            own.append("-tt")
        return self.servers[server].ssh_argv(self.connect_timeout_s, self.options, own)

    def command(self, server: str, words: Sequence[str], root: bool = True, tty: bool = False) -> list[str]:
        """The local argv that runs ``words`` on ``server`` (as root when ``root``)."""
        s = self.servers[server]
        prefix = ["sudo", "-n", "--"] if root and s.user not in ("", "root") else []
        return [*self.argv(server, tty), shlex.join([*prefix, *words])]

    def close(self) -> None:
        """End every multiplexed connection (the sessions on them have ended)."""
        for name in self.servers:
            if self.control_dir and not self.servers[name].is_local:
                subprocess.run([*self.argv(name)[:-2], "-O", "exit", "--", self.servers[name].destination],
                               capture_output=True, timeout=10)

