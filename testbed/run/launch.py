"""How a unit's processes start, run and end: one small contract, a launcher per kind of arm.

Why a contract: a unit runs either a built-in arm (the project's worker and
server, their argv and transport config files, forked by the run's fork
servers: `testbed.run.builtinlauncher`) or a command arm (a user's own
command under docs/commands.md, its log adapted as it grows:
`testbed.run.commandlauncher`). Everything else about a unit is the same
for both (its captures, the CPU and bottleneck samplers, Open vSwitch and
the controller watched, the workers waited for: `testbed.run.runner.ArmRun`).
As httpx's ``BaseTransport`` is one small contract that several transports
implement, `Launcher` is the four calls that supervision makes, and a new
kind of arm is a new launcher, never another branch in the supervision.
"""
from __future__ import annotations

import abc
import dataclasses
import os
import pathlib
import secrets
from typing import Any

from dblp.wire import DEFAULT_PORT
from testbed.config.arms import Arm
from testbed.config.spec import Spec
from testbed.run.processes import ProcessGroup


class ArmFailed(Exception):
    """A unit's process failed; the message carries the log lines that matter."""


@dataclasses.dataclass
class Unit:
    """One unit, an arm trained with one seed, as its launcher sees it.

    ``fab``: the fabric its hosts are on; ``raw``: where everything it writes
    goes (raw/<arm>/seed-<seed>/); ``workers``: the workers' hosts by rank;
    ``procs``: the group that supervises its server and workers. One job per
    unit: its own ``secret`` (key) and ``session_id``, shared by its server
    and workers.
    """

    spec: Spec
    arm: Arm
    fab: Any
    raw: pathlib.Path
    server: str
    workers: list[str]
    seed: int
    procs: ProcessGroup = dataclasses.field(default_factory=ProcessGroup)
    port: int = DEFAULT_PORT
    secret: str = dataclasses.field(default_factory=lambda: secrets.token_hex(32))
    session_id: int = dataclasses.field(default_factory=lambda: secrets.randbits(63) | 1)

    @property
    def serverless(self) -> bool:
        return self.arm.serverless

    def rate_bps(self, role: str) -> float:
        """Pacing rate on the wire. The transport has no congestion control
        (neither has the paper's), so each sender is paced at its fair share
        of the bottleneck: N workers share the server's downlink for the
        push; the server alone fills its uplink for the pull. 5 % headroom
        keeps HTB's queue from building at line rate."""
        tr = self.spec["transport"]
        if tr["rate_mbps"]:
            return tr["rate_mbps"] * 1e6
        bw = self.spec["topology"]["bw_mbps"] * 1e6 * 0.95
        if role == "server" or self.serverless:
            # Sharded: every rank sends to the N-1 others, each destination
            # capped at 1/(N-1) of this rate by the transport (dblp.group), so
            # no downlink is offered more than its line rate.
            return bw
        return bw / len(self.workers)

    def env(self, rank: int | None = None) -> dict:
        """The harness's environment for the server (``rank`` None) or worker ``rank``."""
        env = dict(os.environ)
        env.update({
            "DBLP_CONTROL_SOCKET": str(self.fab.control_socket),
            "WORLD_SIZE": str(len(self.workers)),
            "MASTER_ADDR": self.fab.ip(self.workers[0] if self.serverless else self.server),
            "MASTER_PORT": str(self.port),
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "",
        })
        if self.arm.uses_dblp:
            # The job's key authenticates every datagram; handed to each process
            # in its environment so it never lands in the run directory.
            from dblp.config import SECRET_ENV
            env[SECRET_ENV] = self.secret
        if rank is not None:
            env["RANK"] = str(rank)
            env["GLOO_SOCKET_IFNAME"] = self.fab.intf(self.workers[rank])
        else:
            env["GLOO_SOCKET_IFNAME"] = self.fab.intf(self.server)
        return env


class Launcher(abc.ABC):
    """Starts one unit's server (if any) and workers into ``unit.procs``, and keeps what they
    write true while they run; the supervision calls `start`, then `poll` until every
    worker exited, `finish` once they all did, and `close` whatever happened.

    A failure the unit must stop for is an `ArmFailed`, whose message is what the run
    says of the unit.
    """

    #: How long the supervision waits for the workers between two `poll` calls (seconds):
    #: it bounds how late `poll` sees what a worker just did.
    poll_s: float = 0.5

    def __init__(self, unit: Unit):
        self.unit = unit

    @abc.abstractmethod
    def start(self) -> None:
        """Start the unit's processes (its captures already run): the one call every kind
        of arm needs, so the only abstract one."""

    def poll(self) -> None:  # noqa: B027 - a launcher with nothing to watch keeps this no-op
        """While the workers run, as often as `poll_s` allows: read what they wrote so far,
        for a launcher whose processes do not write the project's own logs."""

    def finish(self) -> None:  # noqa: B027 - a launcher with nothing to settle keeps this no-op
        """Every worker exited: settle what they left before the server is waited for and
        the unit judged."""

    def close(self) -> None:  # noqa: B027 - a launcher that holds nothing keeps this no-op
        """After the processes are stopped, whatever happened (a failure, Ctrl-C): release
        what the launcher holds and leave every log it owns complete."""
