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

Each unit is an `ArmRun`: its launcher (`testbed.run.launch`) starts the
arm's processes, a built-in arm's or a command arm's, and the rest of the
unit is the same for every arm. Progress on stderr is `testbed.run.progress`'s.
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
import signal
import time

from dblp.wire import DEFAULT_PORT
from testbed import output
from testbed.config.arms import get as get_arm
from testbed.config.spec import Spec, transport_config
from testbed.errors import InputError, MachineError
from testbed.run.budget import UnitCpu, pacing_late_frac, rounds_window
from testbed.run.builtinlauncher import BuiltinLauncher, attach_fork_server, start_fork_server
from testbed.run.commandlauncher import CommandLauncher
from testbed.run.fidelity import BottleneckMonitor
from testbed.run.forkservers import ForkServers
from testbed.run.launch import ArmFailed, Launcher, Unit
from testbed.run.ovswatch import OvsWatch
from testbed.run.processes import ProcessGroup
from testbed.run.progress import Progress, RunClock
from testbed.rundir import Manifest, new_run_dir, unit_dir, write_burst_schedule, write_dissector


class Interrupted(Exception):
    """SIGINT/SIGTERM reached the harness: stop the unit, keep what we have."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


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
    units = run_order(spec)
    # Only the built-in arms' processes are forked (`testbed.run.builtinlauncher`); the fork
    # server imports while the fabric starts.
    forks = start_fork_server(run_dir) if any(get_arm(arm).command is None for arm, _ in units) \
        else None
    t0 = time.monotonic()
    try:
        with fabric_cls(topo, run_dir=run_dir, bw_mbps=spec["topology"]["bw_mbps"],
                        queue_pkts=spec["topology"]["queue_pkts"], bursts=schedule,
                        roles={"server": server, "workers": list(workers)},
                        chunk_bytes=spec["transport"]["chunk_bytes"], **more) as fab:
            if len(servers) > 1:
                manifest.update(cluster=fab.fidelity())
            manifest.update(fabric_startup_s=round(time.monotonic() - t0, 2),
                            dblp_port=DEFAULT_PORT, rtt_ms=measure_rtt_ms(fab, workers[0], server))
            output.say(f"fabric up in {time.monotonic() - t0:.1f} s: {len(topo.hosts())} hosts, "
                       f"server {server}, workers {', '.join(workers)}")
            clock = RunClock(units)
            try:
                if forks is not None:
                    attach_fork_server(forks, fab, [server, *workers])
                return _run_units(spec, run_dir, manifest, fab, server, list(workers), units,
                                  clock, forks)
            finally:
                if forks is not None:
                    forks.close()  # before the fabric's teardown ends its group
    finally:
        if forks is not None:
            forks.close()  # the fabric never came up: the server ends here


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
    and the captures, supervised; everything it writes goes to raw/<arm>/seed-<seed>/.

    How the unit's processes start, and what is read while they run, is its
    launcher's (`testbed.run.launch.Launcher`), picked by the arm's kind: a
    command arm's `CommandLauncher`, a built-in arm's `BuiltinLauncher`. The
    rest is the same for every arm and stays here.
    """

    def __init__(self, spec: Spec, arm: str, fab, run_dir: pathlib.Path,
                 server: str, workers: list[str], seed: int | None = None,
                 clock: RunClock | None = None, forks: ForkServers | None = None):
        seed = spec.seed if seed is None else seed
        a = get_arm(arm)
        # gloo and the sharded arms have no aggregation server; their rank 0
        # (the rendezvous master, the ring's first hop, the first shard's
        # owner) takes the server's host instead of worker 0's, so a burst
        # aimed at the server's links hits their traffic exactly as it hits
        # the parameter server's. Every host sits in another pod, so no rank
        # gains a shorter path by the move.
        ranks = [server] + workers[1:] if a.serverless else list(workers)
        self.unit = Unit(spec, a, fab, unit_dir(run_dir, arm, seed), server, ranks, seed)
        self.unit.raw.mkdir(parents=True, exist_ok=True)
        self.launcher: Launcher = CommandLauncher(self.unit) if a.command is not None \
            else BuiltinLauncher(self.unit, forks)   # forks: None, every process a new interpreter
        self.clock = clock   # the whole run's progress, for the round line (None: this unit only)
        self.label = unit_label(arm, seed)
        self.captures = ProcessGroup()

    def run(self) -> dict:
        u = self.unit
        begun = u.fab.unit_begin()  # a cluster's other machines and tunnels, for this unit's share
        try:
            self._start_captures()
            self.launcher.start()
            cpu = UnitCpu(u.fab.controller.pid if u.fab.controller is not None else None)
            sw, port = u.fab.topo.host_switch(u.server)
            link = BottleneckMonitor(f"{sw}-eth{port}", u.spec["topology"]["bw_mbps"],
                                     arm=u.arm.name, queue_log=u.raw / "queue.jsonl")
            try:
                self._supervise(cpu)
            finally:
                link.stop()   # a failed arm's sampler would fork tc on through the next arms
            u.fab.collect()  # the logs of workers on other machines (a cluster), for what follows
            cpu.sample()
            window = rounds_window(u.raw)
            return {**cpu.fractions(window), **link.summary(), **u.fab.unit_fidelity(begun, window),
                    "pacing_late_frac": pacing_late_frac(u.raw),
                    "cpu_budget": cpu.budget(u.raw, window)}
        finally:
            u.procs.stop()
            self.captures.stop(sig=signal.SIGINT)
            self.launcher.close()
            u.fab.unit_fidelity(begun)  # ends its sampling, whatever happened
            u.fab.collect()  # logs and captures written on other machines (a cluster)

    def _start_captures(self):
        u = self.unit
        if not u.spec["capture"]["enabled"]:
            return
        roles = {"server": u.server, **{f"worker{i}": h for i, h in enumerate(u.workers)}}
        seen = set()
        for role in u.spec["capture"]["hosts"]:
            host = roles[role]
            if host in seen:  # gloo, sharded: rank 0 sits on the server's host
                continue
            seen.add(host)
            self.captures.start(
                f"tcpdump-{role}",
                ["tcpdump", "-i", u.fab.intf(host), "-s", str(u.spec["capture"]["snaplen"]),
                 "-w", str(u.raw / f"{role}.pcap"), "-U", "-n", "udp or tcp"],
                u.raw / f"tcpdump-{role}.out", popen=functools.partial(u.fab.popen, host),
                critical=False)
        time.sleep(0.3)  # tcpdump needs a moment before it sees packets

    def _supervise(self, cpu: UnitCpu):
        u, fab = self.unit, self.unit.fab
        rounds = u.spec["training"]["rounds"]
        timeout = u.spec["limits"]["arm_timeout_s"]
        start = time.monotonic()
        progress = Progress(self.label, rounds, u.raw / "worker0.jsonl", clock=self.clock)
        ovs = OvsWatch()
        workers = [f"worker{i}" for i in range(len(u.workers))]
        sampled = 0.0
        while True:
            if time.monotonic() - sampled >= 0.5:
                cpu.sample()
                sampled = time.monotonic()
            progress.show()
            self.launcher.poll()
            gone = ovs.dead()
            if gone:
                raise ArmFailed(f"  Open vSwitch stopped ({', '.join(gone)} exited): "
                                "the fabric forwards nothing; restart it with ./setup.sh")
            if fab.controller is not None and fab.controller.poll() is not None:
                raise ArmFailed(f"  the controller (pid {fab.controller.pid}) exited with "
                                f"{fab.controller.returncode}; see raw/controller.stderr")
            bad = u.procs.failed()
            if bad:
                lines = "\n".join(f"  {m.name} (pid {m.pid}, exit {m.poll()}):\n"
                                  + "\n".join("    " + line for line in m.tail().splitlines())
                                  for m in bad)
                raise ArmFailed(lines)
            if u.procs.wait(workers, timeout=self.launcher.poll_s):
                break
            if time.monotonic() - start > timeout:
                raise ArmFailed(f"  timed out after {timeout:.0f} s (limits.arm_timeout_s)")
        self.launcher.finish()
        # Workers done: the server (if any) finishes its last round and exits.
        u.procs.wait(["server"], timeout=10)
        progress.show(final=True)
        bad = u.procs.failed()
        if bad:
            raise ArmFailed("\n".join(f"  {m.name}: exit {m.poll()}\n{m.tail()}" for m in bad))
