"""The command arms' launcher: a user's own command, its workers' logs adapted while they run.

A command arm (``testbed.config.arms.Command``) runs the spec's command on
the server's host (when it has a server) and on every worker's, under the
contract `testbed.run.command` declares: the environment (`command_env`),
the working directory (`ROOT`) and the JSON lines a worker writes. Unlike a
built-in arm's, its processes do not write the project's raw logs, so this
launcher has work in every call of the contract: `poll` adapts each
worker's new lines (`CommandLog`) and hands rank 0's round starts and ends
to the controller (`RoundAnnouncer`), often (`poll_s`) because a
round-locked burst must hit the round it names; `finish` adapts what is
left and writes each worker's end event; `close` ends every adapted log
whatever happened. A line that breaks the contract fails the unit
(`ArmFailed`) with the one line `ContractError` says.
"""
from __future__ import annotations

import functools
import pathlib

from testbed.run.command import ROOT, CommandLog, ContractError, command_argv, command_env, log_paths
from testbed.run.launch import ArmFailed, Launcher, Unit
from workloads.control import RoundAnnouncer
from workloads.runlog import RunLog


class CommandLauncher(Launcher):
    """A command arm's processes and its workers' adapted logs."""

    #: A command's log lines are read as they come: rank 0's round starts must reach the
    #: controller within milliseconds for a round-locked burst to hit its round.
    poll_s = 0.01

    def __init__(self, unit: Unit):
        super().__init__(unit)
        self.logs: list[CommandLog] = []   # by rank, made by `start`
        self.announcer: RoundAnnouncer | None = None

    def _env(self, role: str, rank: int | None, log: pathlib.Path | None) -> dict:
        u = self.unit
        base = u.env(rank)
        return command_env(base, role=role, rank=rank, world_size=len(u.workers),
                           master_addr=base["MASTER_ADDR"], master_port=u.port,
                           secret=u.secret, seed=u.seed, training=u.spec["training"],
                           rate_bps=u.rate_bps(role), log=log)

    def start(self) -> None:
        """The user's command on the server's host (when it has a server) and on every
        worker's, each worker's log adapted as it grows."""
        u = self.unit
        cmd = u.arm.command
        assert cmd is not None
        t = u.spec["training"]
        if cmd.server is not None:
            u.procs.start("server", command_argv(cmd.server), u.raw / "server.out",
                          popen=functools.partial(u.fab.popen, u.server),
                          env=self._env("server", None, None), cwd=ROOT)
        for rank, host in enumerate(u.workers):
            own, adapted = log_paths(u.raw, rank)
            self.logs.append(CommandLog(
                own, RunLog(str(adapted), u.arm.name, "worker", rank),
                name=f"raw/{u.arm.name}/{u.raw.name}/{own.name}", model=t["model"],
                world_size=len(u.workers), seed=u.seed, rounds=t["rounds"],
                silence_s=cmd.silence_s, batch_size=t["batch_size"], lr=t["lr"]))
            u.procs.start(f"worker{rank}", command_argv(cmd.worker),
                          u.raw / f"worker{rank}.out",
                          popen=functools.partial(u.fab.popen, host),
                          env=self._env("worker", rank, own), cwd=ROOT)
        # Rank 0's rounds drive round-locked bursts, as a serverless built-in arm's do.
        self.announcer = RoundAnnouncer(u.arm.name, path=str(u.fab.control_socket), seed=u.seed)

    def _announce(self, rank: int, events: list[tuple[str, int]]) -> None:
        if rank == 0 and self.announcer is not None:
            for event, rnd in events:
                self.announcer.round(event, rnd)

    def poll(self) -> None:
        """Adapt every worker's new lines; announce rank 0's rounds; a broken contract fails."""
        for rank, log in enumerate(self.logs):
            try:
                events = log.poll()
            except ContractError as exc:
                log.fail(str(exc))
                raise ArmFailed(f"  {exc}") from None
            self._announce(rank, events)

    def finish(self) -> None:
        """Every worker exited: adapt what is left and write each one's end event."""
        self.poll()
        for rank, log in enumerate(self.logs):
            try:
                events = log.finish(self.unit.procs.returncode(f"worker{rank}"))
            except ContractError as exc:
                raise ArmFailed(f"  {exc}") from None
            self._announce(rank, events)

    def close(self) -> None:
        """Whatever happened, every command log ends with an end event and the announcer closes."""
        for rank, log in enumerate(self.logs):
            if not log.done:
                try:   # keep the rounds it wrote before the unit failed
                    log.finish(self.unit.procs.returncode(f"worker{rank}"))
                except ContractError:
                    pass   # said by the unit's failure, and in the log's end event
        if self.announcer is not None:
            self.announcer.close()
