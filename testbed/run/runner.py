"""`dblp-testbed run`: one experiment from a validated spec to its raw/ directory.

The path of one run (docs/architecture.md): a fresh run directory with the resolved spec and a
manifest; the capability check; one routed fabric with the controller and
its burst schedule; for each unit (an arm trained with one seed) the server
and workers on their hosts with packet captures around them. The run stops
at raw/: the tables, plots and report are the analysis's
(`testbed.analysis.pipeline`), which `testbed.run.experiment` chains after it
exactly as `dblp-testbed report` runs it later, so there is one way to
derive them and a failed analysis can never cost the run.

Repetition: every arm runs once per seed (`Spec.seed_values`), all on the
one fabric, seed by seed with the arms in the spec's order inside each seed,
so a drift of the machine over the run (heat, a neighbour's load) falls on
every arm alike instead of on whichever arm ran last. The burst schedule is
resolved once from the spec's seed and hits every unit the same way: the
bursts are the treatment, the seeds vary model initialisation and data order.
Whatever happens (a crashed worker, Ctrl-C, SIGTERM), the fabric is torn
down, the manifest says how the run ended and `raw/` keeps what was measured.

Progress on stderr: each unit starts with a line saying which unit of how
many it is and the run's ETA, and its round line (`Progress`) carries both;
the run's ETA comes from the finished units' durations (`run_remaining_s`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
import secrets
import signal
import sys
import time

from dblp.wire import DEFAULT_PORT
from testbed import output
from testbed.config.arms import get as get_arm
from testbed.config.spec import Spec, transport_config
from testbed.errors import InputError, MachineError
from testbed.run.budget import UnitCpu, pacing_late_frac, rounds_window
from testbed.run.command import CommandLog
from testbed.run.fidelity import BottleneckMonitor
from testbed.run.forkservers import ForkServerError, ForkServers
from testbed.run.processes import ProcessGroup
from testbed.rundir import Manifest, new_run_dir, unit_dir, write_burst_schedule, write_dissector
from workloads.control import RoundAnnouncer


class Interrupted(Exception):
    """SIGINT/SIGTERM reached the harness: stop the unit, keep what we have."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class ArmFailed(Exception):
    """A unit's process failed; the message carries the log lines that matter."""


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


@dataclasses.dataclass(frozen=True)
class Finished:
    """How a run ended: its status ("ok" or a failure) and its run directory."""

    status: str
    run_dir: pathlib.Path


def run_experiment(spec: Spec, out: str | None) -> Finished:
    """Run every arm of `spec` once per seed into a fresh run directory's raw/.

    Nothing is created before the machine is known to be able to run it:
    a missing emulator piece or another live run is a `MachineError`.
    """
    from testbed.config.arms import ARMS
    from testbed.emulation import capabilities, cleanup

    if spec.schedule is None:
        raise InputError("a spec runs only as `testbed.config.spec.load` or `validate` made it "
                         "(they resolve its bursts into Spec.schedule)")
    for arm in (ARMS[name] for name in spec.arms):
        # Every dblp arm's transport settings as its processes will read them: an arm
        # that may not run here (the test-only slowed twin) is refused before anything starts.
        if arm.uses_dblp:
            transport_config(spec["transport"], arm)
    live = cleanup.live_fabric()
    if live is not None:
        raise MachineError(f"another run is live on this machine: {cleanup.describe(live)}; "
                           "wait for it to finish (Mininet names interfaces machine-wide)")
    caps = capabilities.check()
    if caps["problems"]:
        raise MachineError(f"cannot emulate here: {caps['problems'][0]}")
    run_dir = new_run_dir(spec, out)
    manifest = Manifest(run_dir, spec, caps)
    output.say(f"run directory: {run_dir}")
    core_note = capabilities.c_core_warning(caps["c_core"])
    if core_note:  # the manifest records it too; said now: every timing of the run depends on it
        output.warn(core_note)
    old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    status, error = "ok", None
    try:
        schedule = write_burst_schedule(run_dir, spec.schedule)
        if spec["capture"]["enabled"]:
            write_dissector(run_dir)
        status = _run_on_fabric(spec, run_dir, manifest, schedule)
    except Interrupted as exc:
        status, error = "interrupted", f"stopped by {exc}"
    except Exception as exc:  # noqa: BLE001 - reported, partial results kept
        status, error = "error", f"{type(exc).__name__}: {exc}"
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        manifest.finish(status, error)
        if error:
            output.warn(f"dblp-testbed: run {status}: {error}")
    return Finished(status, run_dir)


def _run_on_fabric(spec: Spec, run_dir: pathlib.Path, manifest: Manifest,
                   schedule: dict) -> str:
    from testbed.config.spec import build_topology
    from testbed.emulation.fabric import Fabric
    from topologies import TOPOLOGIES

    topo = build_topology(spec["topology"], TOPOLOGIES, spec["placement"]["workers"])
    server, workers = topo.place(spec["placement"]["workers"])
    servers = spec["cluster"]["servers"]
    fabric_cls, more = Fabric, {}
    if len(servers) > 1:
        from testbed.emulation.cluster.fabric import ClusterFabric, local_first

        fabric_cls = ClusterFabric
        more = {"servers": servers, "ssh_options": spec["cluster"]["ssh_options"]}
        workers = local_first(topo, servers, list(workers))
    manifest.update(placement={"server": server, "workers": list(workers)})
    t0 = time.monotonic()
    with fabric_cls(topo, run_dir=run_dir, bw_mbps=spec["topology"]["bw_mbps"],
                    queue_pkts=spec["topology"]["queue_pkts"], bursts=schedule,
                    roles={"server": server, "workers": list(workers)},
                    chunk_bytes=spec["transport"]["chunk_bytes"], **more) as fab:
        if len(servers) > 1:
            manifest.update(cluster=fab.fidelity())
        manifest.update(fabric_startup_s=round(time.monotonic() - t0, 2), dblp_port=DEFAULT_PORT,
                        rtt_ms=measure_rtt_ms(fab, workers[0], server))
        output.say(f"fabric up in {time.monotonic() - t0:.1f} s: {len(topo.hosts())} hosts, "
                   f"server {server}, workers {', '.join(workers)}")
        units = run_order(spec)
        clock = RunClock(units)
        if any(get_arm(arm).command is None for arm, _ in units):
            t1 = time.monotonic()
            forks = ForkServers(fab, run_dir, [server, *workers],
                                dict(os.environ, OMP_NUM_THREADS="1"))
            output.say(f"fork servers ready in {time.monotonic() - t1:.1f} s on "
                       f"{len(forks.servers)} hosts (torch imported once per host)")
        else:
            forks = None
        try:
            return _run_units(spec, run_dir, manifest, fab, server, list(workers), units, clock,
                              forks)
        finally:
            if forks is not None:
                forks.close()


def _run_units(spec: Spec, run_dir: pathlib.Path, manifest: Manifest, fab, server: str,
               workers: list[str], units: list[tuple[str, int]], clock: RunClock,
               forks: ForkServers | None) -> str:
    """The units one after another on the fabric: "ok", or "failed" at the first that fails."""
    for i, (arm, seed) in enumerate(units):
        clock.start(i)
        output.say(clock.start_line(unit_label(arm, seed)))
        manifest.unit(arm, seed, status="running", started_ns=time.time_ns())
        try:
            fidelity = ArmRun(spec, arm, fab, run_dir, server, workers, seed,
                              clock=clock, forks=forks).run()
            clock.finish()
            manifest.unit(arm, seed, status="ok", ended_ns=time.time_ns(), fidelity=fidelity)
        except ArmFailed as exc:
            # Fail fast: a broken unit usually means a broken fabric or
            # code, and every later unit would be compared against it.
            manifest.unit(arm, seed, status="failed", ended_ns=time.time_ns(), error=str(exc))
            for later in units[i + 1:]:
                manifest.unit(*later, status="skipped")
            output.warn(f"[{unit_label(arm, seed)}] failed:\n{exc}")
            return "failed"
        except Interrupted:
            manifest.unit(arm, seed, status="interrupted", ended_ns=time.time_ns())
            for later in units[i + 1:]:
                manifest.unit(*later, status="skipped")
            raise
    return "ok"


def run_order(spec: Spec) -> list[tuple[str, int]]:
    """The units (arm, seed) in the order they run: seed by seed, the spec's arms within each."""
    return [(arm, seed) for seed in spec.seed_values for arm in spec.arms]


def unit_label(arm: str, seed: int) -> str:
    """How progress and failures name a unit: ``dblp s2`` is arm dblp with seed 2
    (its logs in raw/dblp/seed-2/)."""
    return f"{arm} s{seed}"


def measure_rtt_ms(fab, src: str, dst: str) -> float | None:
    """Median idle RTT worker->server: the per-pass cost in the round bound.

    Seven echoes 50 ms apart (root may send faster than ping's 0.2 s): each
    still meets an idle path, and the run starts a second sooner.
    """
    import re
    res = fab.run(src, ["ping", "-c", "7", "-i", "0.05", "-W", "2", fab.ip(dst)], timeout=20)
    rtts = sorted(float(x) for x in re.findall(r"time=([0-9.]+) ms", res.stdout))[1:]
    return rtts[len(rtts) // 2] if rtts else None


class ArmRun:
    """One unit, an arm trained with one seed: the server (if any), the workers
    and the captures, supervised; everything it writes goes to raw/<arm>/seed-<seed>/."""

    def __init__(self, spec: Spec, arm: str, fab, run_dir: pathlib.Path,
                 server: str, workers: list[str], seed: int | None = None,
                 clock: RunClock | None = None, forks: ForkServers | None = None):
        self.spec, self.fab = spec, fab
        self.forks = forks   # the run's fork servers (None: every process a new interpreter)
        self.clock = clock   # the whole run's progress, for the round line (None: this unit only)
        self.arm = get_arm(arm)
        self.seed = spec.seed if seed is None else seed
        self.label = unit_label(arm, self.seed)
        self.raw = unit_dir(run_dir, arm, self.seed)
        self.raw.mkdir(parents=True, exist_ok=True)
        self.server = server
        # gloo and the sharded arms have no aggregation server; their rank 0
        # (the rendezvous master, the ring's first hop, the first shard's
        # owner) takes the server's host instead of worker 0's, so a burst
        # aimed at the server's links hits their traffic exactly as it hits
        # the parameter server's. Every host sits in another pod, so no rank
        # gains a shorter path by the move.
        self.serverless = self.arm.serverless
        self.workers = [server] + workers[1:] if self.serverless else list(workers)
        self.procs = ProcessGroup()
        self.captures = ProcessGroup()
        self.port = DEFAULT_PORT
        # One job per unit: its own key and session, shared by its server and workers.
        self.secret = secrets.token_hex(32)
        self.session_id = secrets.randbits(63) | 1
        # A command arm's workers' logs, read and adapted while they run (testbed.run.command).
        self.command_logs: list[CommandLog] = []
        self.announcer: RoundAnnouncer | None = None

    # -- argv builders: lists only, never a shell ---------------------------
    def _common_args(self) -> list[str]:
        t = self.spec["training"]
        args = ["--model", t["model"], "--rounds", str(t["rounds"]), "--seed", str(self.seed)]
        if t["lr"]:
            args += ["--lr", str(t["lr"])]
        if t["lr_schedule"] != "constant":
            args += ["--lr-schedule", t["lr_schedule"]]
        if t["batch_size"]:
            args += ["--batch-size", str(t["batch_size"])]
        return args

    def _rate_bps(self, role: str) -> float:
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

    def _transport_args(self, role: str) -> list[str]:
        """``--transport-config PATH``: the arm's settings as a file, never as argv strings.

        One ``dblp.TransportConfig`` per role (the pacing rate is the role's
        fair share), written into ``raw/<arm>/seed-<seed>/``; they differ in nothing else.
        The per-arm secret stays out of the run directory (see `_env`).
        """
        if not self.arm.uses_dblp:
            return []
        from dblp.config import CONFIG_FILE
        cfg = transport_config(self.spec["transport"], self.arm, rate_bps=self._rate_bps(role))
        cfg = dataclasses.replace(cfg, session_id=self.session_id)
        path = self.raw / (CONFIG_FILE if role == "worker" else f"{role}.{CONFIG_FILE}")
        cfg.write(path)
        return ["--transport-config", str(path)]

    def _integration_args(self) -> list[str]:
        """``--integration NAME`` for an arm whose loop is not the default (``ddp``)."""
        from workloads.integrations import FLAT
        return [] if self.arm.integration == FLAT else ["--integration", self.arm.integration]

    def _env(self, rank: int | None = None) -> dict:
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

    def run(self) -> dict:
        py = sys.executable
        begun = self.fab.unit_begin()  # a cluster's other machines and tunnels, for this unit's share
        try:
            self._start_captures()
            if self.arm.command is not None:
                self._start_command()
            else:
                self._start_workload(py)
            cpu = UnitCpu(self.fab.controller.pid if self.fab.controller is not None else None)
            sw, port = self.fab.topo.host_switch(self.server)
            link = BottleneckMonitor(f"{sw}-eth{port}", self.spec["topology"]["bw_mbps"],
                                     arm=self.arm.name, queue_log=self.raw / "queue.jsonl")
            try:
                self._supervise(cpu)
            finally:
                link.stop()   # a failed arm's sampler would fork tc on through the next arms
            self.fab.collect()  # the logs of workers on other machines (a cluster), for what follows
            cpu.sample()
            window = rounds_window(self.raw)
            return {**cpu.fractions(window), **link.summary(), **self.fab.unit_fidelity(begun, window),
                    "pacing_late_frac": pacing_late_frac(self.raw),
                    "cpu_budget": cpu.budget(self.raw, window)}
        finally:
            self.procs.stop()
            self.captures.stop(sig=signal.SIGINT)
            self._close_command()
            self.fab.unit_fidelity(begun)  # ends its sampling, whatever happened
            self.fab.collect()  # logs and captures written on other machines (a cluster)

    def _start_workload(self, py: str):
        """A built-in arm: workloads.server (when the arm has a server) and workloads.worker,
        forked by the run's fork servers where it has them."""
        try:
            self._start_workload_processes(py)
        except ForkServerError as exc:
            raise ArmFailed(f"  {exc}") from None

    def _popen(self, host: str):
        return self.forks.popen_for(host) if self.forks is not None \
            else functools.partial(self.fab.popen, host)

    def _start_workload_processes(self, py: str):
        if not self.serverless:
            self.procs.start(
                "server", [py, "-m", "workloads.server", "--arm", self.arm.transport,
                           "--label", self.arm.name,
                           "--log", str(self.raw / "server.jsonl"), "--port", str(self.port),
                           "--rounds", str(self.spec["training"]["rounds"]),
                           "--model", self.spec["training"]["model"],
                           "--seed", str(self.seed)]
                + self._transport_args("server"),
                self.raw / "server.out", popen=self._popen(self.server),
                env=self._env())
        for rank, host in enumerate(self.workers):
            self.procs.start(
                f"worker{rank}", [py, "-m", "workloads.worker", "--arm", self.arm.transport,
                                  "--label", self.arm.name,
                                  "--log", str(self.raw / f"worker{rank}.jsonl")]
                + self._common_args() + self._transport_args("worker")
                + self._integration_args()
                + ["--eval-every", str(self.spec["training"]["eval_every"])],
                self.raw / f"worker{rank}.out", popen=self._popen(host),
                env=self._env(rank))

    def _start_command(self):
        """A command arm: the user's command on the server's host (when it has a server) and
        on every worker's, each worker's log adapted as it grows (testbed.run.command)."""
        from testbed.run.command import ROOT, command_argv, command_env, log_paths
        from workloads.runlog import RunLog

        cmd = self.arm.command
        assert cmd is not None
        t = self.spec["training"]

        def env(role: str, rank: int | None, log: pathlib.Path | None) -> dict:
            base = self._env(rank)
            return command_env(base, role=role, rank=rank, world_size=len(self.workers),
                               master_addr=base["MASTER_ADDR"], master_port=self.port,
                               secret=self.secret, seed=self.seed, training=t,
                               rate_bps=self._rate_bps(role), log=log)

        if cmd.server is not None:
            self.procs.start("server", command_argv(cmd.server), self.raw / "server.out",
                             popen=functools.partial(self.fab.popen, self.server),
                             env=env("server", None, None), cwd=ROOT)
        for rank, host in enumerate(self.workers):
            own, adapted = log_paths(self.raw, rank)
            self.command_logs.append(CommandLog(
                own, RunLog(str(adapted), self.arm.name, "worker", rank),
                name=f"raw/{self.arm.name}/{self.raw.name}/{own.name}", model=t["model"],
                world_size=len(self.workers), seed=self.seed, rounds=t["rounds"],
                silence_s=cmd.silence_s, batch_size=t["batch_size"], lr=t["lr"]))
            self.procs.start(f"worker{rank}", command_argv(cmd.worker),
                             self.raw / f"worker{rank}.out",
                             popen=functools.partial(self.fab.popen, host),
                             env=env("worker", rank, own), cwd=ROOT)
        # Rank 0's rounds drive round-locked bursts, as a serverless built-in arm's do.
        self.announcer = RoundAnnouncer(self.arm.name, path=str(self.fab.control_socket),
                                        seed=self.seed)

    def _poll_command(self):
        """Adapt every worker's new lines; announce rank 0's rounds; a broken contract fails."""
        from testbed.run.command import ContractError
        for rank, log in enumerate(self.command_logs):
            try:
                events = log.poll()
            except ContractError as exc:
                log.fail(str(exc))
                raise ArmFailed(f"  {exc}") from None
            if rank == 0 and self.announcer is not None:
                for event, rnd in events:
                    self.announcer.round(event, rnd)

    def _finish_command(self):
        """Every worker exited: adapt what is left and write each one's end event."""
        from testbed.run.command import ContractError
        self._poll_command()
        for rank, log in enumerate(self.command_logs):
            try:
                events = log.finish(self.procs.returncode(f"worker{rank}"))
            except ContractError as exc:
                raise ArmFailed(f"  {exc}") from None
            if rank == 0 and self.announcer is not None:
                for event, rnd in events:
                    self.announcer.round(event, rnd)

    def _close_command(self):
        """Whatever happened, every command log ends with an end event and the announcer closes."""
        from testbed.run.command import ContractError
        for rank, log in enumerate(self.command_logs):
            if not log.done:
                try:   # keep the rounds it wrote before the unit failed
                    log.finish(self.procs.returncode(f"worker{rank}"))
                except ContractError:
                    pass   # said by the unit's failure, and in the log's end event
        if self.announcer is not None:
            self.announcer.close()

    def _start_captures(self):
        if not self.spec["capture"]["enabled"]:
            return
        roles = {"server": self.server, **{f"worker{i}": h for i, h in enumerate(self.workers)}}
        seen = set()
        for role in self.spec["capture"]["hosts"]:
            host = roles[role]
            if host in seen:  # gloo, sharded: rank 0 sits on the server's host
                continue
            seen.add(host)
            self.captures.start(
                f"tcpdump-{role}",
                ["tcpdump", "-i", self.fab.intf(host), "-s", str(self.spec["capture"]["snaplen"]),
                 "-w", str(self.raw / f"{role}.pcap"), "-U", "-n", "udp or tcp"],
                self.raw / f"tcpdump-{role}.out", popen=functools.partial(self.fab.popen, host),
                critical=False)
        time.sleep(0.3)  # tcpdump needs a moment before it sees packets

    def _supervise(self, cpu: UnitCpu):
        rounds = self.spec["training"]["rounds"]
        timeout = self.spec["limits"]["arm_timeout_s"]
        start = time.monotonic()
        progress = Progress(self.label, rounds, self.raw / "worker0.jsonl", clock=self.clock)
        ovs = OvsWatch()
        workers = [f"worker{i}" for i in range(len(self.workers))]
        # A command's log lines are read as they come: rank 0's round starts must reach the
        # controller within milliseconds for a round-locked burst to hit its round.
        wait_s = 0.01 if self.command_logs else 0.5
        sampled = 0.0
        while True:
            if time.monotonic() - sampled >= 0.5:
                cpu.sample()
                sampled = time.monotonic()
            progress.show()
            if self.command_logs:
                self._poll_command()
            gone = ovs.dead()
            if gone:
                raise ArmFailed(f"  Open vSwitch stopped ({', '.join(gone)} exited): "
                                "the fabric forwards nothing; restart it with ./setup.sh")
            if self.fab.controller is not None and self.fab.controller.poll() is not None:
                raise ArmFailed(f"  the controller (pid {self.fab.controller.pid}) exited with "
                                f"{self.fab.controller.returncode}; see raw/controller.stderr")
            bad = self.procs.failed()
            if bad:
                lines = "\n".join(f"  {m.name} (pid {m.pid}, exit {m.poll()}):\n"
                                  + "\n".join("    " + line for line in m.tail().splitlines())
                                  for m in bad)
                raise ArmFailed(lines)
            if self.procs.wait(workers, timeout=wait_s):
                break
            if time.monotonic() - start > timeout:
                raise ArmFailed(f"  timed out after {timeout:.0f} s (limits.arm_timeout_s)")
        if self.command_logs:
            self._finish_command()
        # Workers done: the server (if any) finishes its last round and exits.
        self.procs.wait(["server"], timeout=10)
        progress.show(final=True)
        bad = self.procs.failed()
        if bad:
            raise ArmFailed("\n".join(f"  {m.name}: exit {m.poll()}\n{m.tail()}" for m in bad))


def span(seconds: float | None) -> str:
    """A duration as progress lines say it: ``45 s``, ``12 min 05 s``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = max(0, round(seconds))
    return f"{s} s" if s < 100 else f"{s // 60} min {s % 60:02d} s"


def run_remaining_s(units: list[tuple[str, int]], index: int,
                    durations: dict[str, list[float]], unit_elapsed_s: float,
                    unit_left_s: float | None) -> float | None:
    """Seconds until the run ends, while unit ``index`` of ``units`` runs (None: no basis yet).

    A unit not started yet is estimated at the mean wall time of the finished
    units of its arm (arms differ most: ``local`` takes seconds, a dblp arm
    under bursts minutes), else at the mean of every finished unit; before
    any unit finished, at the running unit's own projected wall time
    (``unit_elapsed_s + unit_left_s``). The running unit's remainder is
    ``unit_left_s``, its own ETA from its rounds (`Progress`), or, before
    its first round, its estimate less the time it has run.
    """
    every = [d for ds in durations.values() for d in ds]

    def estimate(arm: str) -> float | None:
        own = durations.get(arm) or every
        return sum(own) / len(own) if own else None

    left = unit_left_s
    if left is None:
        est = estimate(units[index][0])
        left = None if est is None else max(0.0, est - unit_elapsed_s)
    if left is None:
        return None
    later = [estimate(arm) if every else unit_elapsed_s + left for arm, _ in units[index + 1:]]
    if any(e is None for e in later):
        return None
    return left + sum(e for e in later if e is not None)


class RunClock:
    """Where the run is: which unit of how many runs, and the run's ETA (`run_remaining_s`).

    A unit's duration is its wall time from its start to its end: starting
    its processes and captures, its rounds, and stopping them.
    """

    def __init__(self, units: list[tuple[str, int]]):
        self.units = list(units)
        self.t0 = time.monotonic()
        self.index = -1
        self.unit_t0 = self.t0
        self.durations: dict[str, list[float]] = {}

    def start(self, index: int, now: float | None = None) -> None:
        self.index = index
        self.unit_t0 = time.monotonic() if now is None else now

    def finish(self, now: float | None = None) -> None:
        """The running unit finished: its duration now informs the estimates."""
        now = time.monotonic() if now is None else now
        self.durations.setdefault(self.units[self.index][0], []).append(now - self.unit_t0)

    def place(self) -> str:
        return f"unit {self.index + 1}/{len(self.units)}"

    def remaining_s(self, unit_left_s: float | None = None, now: float | None = None
                    ) -> float | None:
        now = time.monotonic() if now is None else now
        return run_remaining_s(self.units, self.index, self.durations, now - self.unit_t0,
                               unit_left_s)

    def start_line(self, label: str, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        return (f"[{label}] {self.place()} starts; run elapsed {span(now - self.t0)}, "
                f"run ETA {span(self.remaining_s(None, now))}")


class Progress:
    """One status line per unit ("[dblp s2] unit 3/12 round 40/200 ..."): round, rate and
    ETA from rank 0's log, and with a `RunClock` the unit's place and the whole run's ETA."""

    def __init__(self, arm: str, rounds: int, log: pathlib.Path, clock: RunClock | None = None):
        self.arm, self.rounds, self.log = arm, rounds, log
        self.clock = clock
        self.t0 = time.monotonic()
        self.last_print = 0.0
        self.round = 0
        self.tty = sys.stderr.isatty()

    def _latest_round(self) -> int:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 4096))
                tail = fh.read().decode(errors="replace").splitlines()
        except OSError:
            return self.round
        for line in reversed(tail):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "round":
                return int(rec["round"]) + 1
        return self.round

    def show(self, final: bool = False):
        now = time.monotonic()
        if not final and now - self.last_print < (1.0 if self.tty else 15.0):
            return
        self.last_print = now
        self.round = self._latest_round()
        el = now - self.t0
        # Before the first round there is no rate to extrapolate: the ETA is "?", not nan.
        eta = el / self.round * (self.rounds - self.round) if self.round else None
        place = f" {self.clock.place()}" if self.clock is not None else ""
        msg = (f"[{self.arm}]{place} round {self.round}/{self.rounds}  elapsed {el:5.0f} s  "
               f"ETA {'?' if eta is None else f'{eta:.0f}':>5} s")
        if self.clock is not None:
            msg += f"  run ETA {span(self.clock.remaining_s(eta, now))}"
        if self.tty and not final:
            output.say("\r" + msg, nl=False)
        else:
            output.say(("\r" if self.tty else "") + msg)


class OvsWatch:
    """Notices within a poll when Open vSwitch dies under a running arm.

    Without OVS the fabric forwards nothing; workers would only notice at
    their round deadline. Checking the daemons' PIDs costs no process."""

    PIDFILES = ("/var/run/openvswitch/ovs-vswitchd.pid", "/var/run/openvswitch/ovsdb-server.pid")

    def __init__(self):
        self.pids = {}
        for f in self.PIDFILES:
            try:
                self.pids[f] = int(pathlib.Path(f).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass

    def dead(self) -> list[str]:
        out = []
        for f, pid in self.pids.items():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                out.append(pathlib.Path(f).stem)
        return out
