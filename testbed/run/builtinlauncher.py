"""The built-in arms' launcher: the project's server and workers, forked by the run's fork servers.

A built-in arm runs ``workloads.server`` (when the arm has a server) and
``workloads.worker``, started from argument lists (never a shell). Its
settings cross into the processes as files in the unit's directory, never as
argv strings to be parsed again: what it trains as ``training.json``
(``--training-config``, a ``workloads.training.TrainingSettings`` written
once per unit and read by its server and every worker), how it exchanges as
``transport.json`` (``--transport-config``); its key only in their
environment (`testbed.run.launch.Unit.env`). The
processes are forked on their hosts by the run's fork servers
(`testbed.run.forkservers`, started here once per run by
`start_fork_server`), so torch is imported once per run, not once per
process and unit. They write the project's own raw logs, so there is
nothing to read while they run: `poll`, `finish` and `close` are the
contract's no-ops.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import sys
import time
from collections.abc import Sequence

from testbed import output
from testbed.config.spec import transport_config
from testbed.run.forkservers import ForkServerError, ForkServers
from testbed.run.launch import ArmFailed, Launcher, Unit
from workloads.training import TRAINING_FILE, TrainingSettings


def start_fork_server(run_dir: pathlib.Path) -> ForkServers:
    """The run's fork server, importing while the fabric starts (`ForkServers`)."""
    return ForkServers(run_dir, dict(os.environ, OMP_NUM_THREADS="1"))


def attach_fork_server(forks: ForkServers, fab, hosts: Sequence[str]) -> None:
    """The fork server serving ``hosts`` of the running fabric, ready before the first unit."""
    t1 = time.monotonic()
    forks.attach(fab, hosts)
    output.say(f"fork server ready {time.monotonic() - t1:.1f} s after the fabric, for "
               f"{len(forks.hosts)} hosts (torch imported once)")


class BuiltinLauncher(Launcher):
    """A built-in arm's processes; ``forks``: the run's fork servers (None: every process a
    new interpreter)."""

    def __init__(self, unit: Unit, forks: ForkServers | None = None):
        super().__init__(unit)
        self.forks = forks

    # -- argv builders: lists only, never a shell ---------------------------
    def training_args(self) -> list[str]:
        """``--training-config PATH``: the spec's training settings and the unit's seed as
        ``raw/<arm>/seed-<seed>/training.json``, for the server and every worker alike.

        The spec's 0 for a learning rate or a batch ("the model's own") is the file's null.
        """
        u = self.unit
        t = u.spec["training"]
        settings = TrainingSettings(model=t["model"], rounds=t["rounds"], seed=u.seed,
                                    lr=t["lr"] or None, lr_schedule=t["lr_schedule"],
                                    batch_size=t["batch_size"] or None, eval_every=t["eval_every"])
        path = u.raw / TRAINING_FILE
        settings.write(path)
        return ["--training-config", str(path)]

    def transport_args(self, role: str) -> list[str]:
        """``--transport-config PATH``: the arm's settings as a file, never as argv strings.

        One ``dblp.TransportConfig`` per role (the pacing rate is the role's
        fair share), written into ``raw/<arm>/seed-<seed>/``; they differ in nothing else.
        The per-arm secret stays out of the run directory (see `Unit.env`).
        """
        u = self.unit
        if not u.arm.uses_dblp:
            return []
        from dblp.config import CONFIG_FILE
        cfg = transport_config(u.spec["transport"], u.arm, rate_bps=u.rate_bps(role))
        cfg = dataclasses.replace(cfg, session_id=u.session_id)
        path = u.raw / (CONFIG_FILE if role == "worker" else f"{role}.{CONFIG_FILE}")
        cfg.write(path)
        return ["--transport-config", str(path)]

    def integration_args(self) -> list[str]:
        """``--integration NAME`` and its ``--backend`` for an arm whose loop is not the
        default (``ddp``, ``ddp-gloo``, a spec's ``[ddp.NAME]``): the arm's `worker_args`."""
        return self.unit.arm.worker_args

    # -- the contract ---------------------------------------------------------
    def start(self) -> None:
        """workloads.server (when the arm has a server) and workloads.worker; a fork server
        that fails fails the unit."""
        try:
            self._start_processes(sys.executable)
        except ForkServerError as exc:
            raise ArmFailed(f"  {exc}") from None

    def _popen(self, host: str):
        return self.forks.popen_for(host) if self.forks is not None \
            else functools.partial(self.unit.fab.popen, host)

    def _start_processes(self, py: str) -> None:
        u = self.unit
        trains = self.training_args()   # one file, written once, for every process of the unit
        if not u.serverless:
            u.procs.start(
                "server", [py, "-m", "workloads.server", "--arm", u.arm.transport,
                           "--label", u.arm.name,
                           "--log", str(u.raw / "server.jsonl"), "--port", str(u.port)]
                + trains + self.transport_args("server"),
                u.raw / "server.out", popen=self._popen(u.server),
                env=u.env())
        worker_transport = self.transport_args("worker")
        for rank, host in enumerate(u.workers):
            u.procs.start(
                f"worker{rank}", [py, "-m", "workloads.worker", "--arm", u.arm.transport,
                                  "--label", u.arm.name,
                                  "--log", str(u.raw / f"worker{rank}.jsonl")]
                + trains + worker_transport + self.integration_args(),
                u.raw / f"worker{rank}.out", popen=self._popen(host),
                env=u.env(rank))
