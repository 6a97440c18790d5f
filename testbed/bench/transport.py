"""`dblp-testbed bench transport`: DBLP vs gloo on a shaped veth pair between two namespaces.

The pair (`testbed.emulation.netns.NetnsPair`): namespace a holds the worker
(gloo rank 0, sharded rank 0), namespace b the aggregator (gloo rank 1,
sharded rank 1), joined by a veth pair shaped with HTB (default 100 Mbit/s).
Random loss is an nftables drop on the input hook of both namespaces, applied
to every UDP and TCP packet (data, control, gloo alike), so "loss p" means p
in each direction for everything. Receive offload (GRO) is on at both ends
for a loss-free row and off for a lossy one, whose drops must see every
packet; each row records which (``gro``). One round trip = push of the
gradient to the aggregator + pull of the aggregate (one DBLP round, measured
at the worker); gloo's row is one ``all_reduce`` of the same tensor between
the same hosts. ``--loss-on data`` restricts the loss to the transport's DATA
datagrams, and ``--costs prototype`` (or ``both``) runs the DBLP rows with the
authors' prototype's costs as the README's cost table's first step has them
(`testbed.bench.transport_doc.prototype_costs`); each row records its ``costs``.

This module is the driver and the CLI: the agents that run in the namespaces
are `testbed.bench.agents`, the document and its rows `testbed.bench.transport_doc`.
"""
from __future__ import annotations

import functools
import os
import secrets
import signal
import sys
import uuid

import click

from controllers.traffic import TRAFFIC
from testbed import output
from testbed.bench.agents import Agent
from testbed.bench.transport_doc import (
    COSTS,
    HEADER,
    OFFLOADS_SOFTWARE,
    SIDES,
    Config,
    bench_doc,
    bench_row,
    default_configs,
    format_row,
    format_table,
    prototype_costs,
)
from testbed.cpustat import CpuTally
from testbed.emulation.netns import DEFAULT_RATE, NetnsPair
from testbed.errors import ExperimentFailed
from testbed.options import rate_option
from testbed.output import json_option, results
from testbed.references import PROTOTYPE_COSTS

__all__ = ["Config", "NetnsPair", "default_configs", "format_table", "run_bench", "transport_cmd"]

DEFAULT_LOSSES = (0.0, 0.01, 0.10, 0.50, 0.80)
DEFAULT_NUMEL = 1 << 20  # 4 MiB of float32


def run_bench(losses=DEFAULT_LOSSES, reps: int = 5, numel: int = DEFAULT_NUMEL,
              rate_bps: float = DEFAULT_RATE, configs=None, round_timeout: float = 30.0,
              log=print, rows: list[dict] | None = None, traffic: str = "all",
              prototype: dict | None = None) -> dict:
    """Run every config at every loss on one shaped veth pair; return the JSON document.

    The configs' round trips are interleaved: at each loss, repetition k of every
    config runs before repetition k+1 of any. Transports compared within a run
    (sharded against gloo, a bound against another) then meet the same machine:
    on a shared 2-core host its state drifts over tens of seconds, and a row run
    whole before the next could catch a slow spell the other did not (at
    10 Gbit/s one row's seven round trips all at 0.16-0.17 s, the next's at
    0.11-0.12 s). Each row is charged the CPU busy/steal of its own round trips.

    Each finished row is appended to ``rows`` (the caller's list, if given) once
    its loss is measured, and on a failure every row with a measured repetition,
    so a bench that fails part way still has what it measured: ``transport_cmd``
    writes those rows, with the error, before it reports it. A finished document
    lists rows by config, then loss.

    ``traffic`` (``controllers.traffic.TRAFFIC``): which packets the loss takes;
    "data" spares the control path (PROBE/BITMAP/STOP/FINAL and the TCP control
    connection), so a high loss measures passes, not TCP's own stall. gloo's
    TCP is no DBLP data: under "data" it meets no loss, under "control" all of it.

    ``prototype`` (`prototype_costs`, made here when None and a config needs
    it): the settings the configs with ``costs="prototype"`` run with.
    """
    configs = configs or default_configs()
    rows = [] if rows is None else rows
    first_row = len(rows)  # this bench's rows start here: measured loss by loss
    if prototype is None and any(c.costs == "prototype" for c in configs):
        prototype = prototype_costs()
    doc = bench_doc(losses, reps, numel, rate_bps, rows, traffic, prototype)
    settings = (prototype or {}).get("settings", {})
    nbytes, floor_s, chunks = doc["bytes"], doc["floor_s"], doc["chunks"]
    port = [47000]
    # Made in the document's row order, before anything runs.
    tallies = {(c, loss): CpuTally() for c in range(len(configs)) for loss in losses}

    def start(cfg):
        port[0] += 1
        return _start(pair, cfg, numel, rate_bps, round_timeout, port[0], settings)

    agents: dict[int, list[Agent]] = {}
    with NetnsPair(rate_bps) as pair:
        if not pair.checksum_offload:
            doc["offloads"] = OFFLOADS_SOFTWARE
        try:
            for loss in losses:
                # Receive offload wherever the loss hook allows it (see NetnsPair); every
                # round trip below puts the link back to no loss when it ends.
                pair.set_gro(loss <= 0)
                runs = [_RowRun(cfg) for cfg in configs]

                def finish(c: int, run: _RowRun, loss: float = loss) -> None:
                    row = bench_row(run.cfg, loss, run.stats, run.errors, run.timeouts, floor_s,
                               chunks, reps, round_timeout, cpu=run.cpu, moved_bytes=2 * nbytes)
                    # The row's round trips (agent restarts included): a busy or stolen CPU
                    # is a confound of every figure in it, and a reader cannot see it otherwise.
                    row["cpu_busy_frac"] = tallies[(c, loss)].busy_fraction()
                    row["cpu_steal_frac"] = tallies[(c, loss)].steal_fraction()
                    row["gro"] = pair.gro
                    if run.cfg.control == "tcp":
                        row["tcp"] = run.tcp
                    rows.append(row)
                    log(format_row(row))

                try:
                    for _ in range(reps):
                        for c, run in enumerate(runs):
                            if run.given_up:
                                continue
                            machine = tallies[(c, loss)]
                            machine.start()
                            tcp0 = pair.tcp_counters() if run.cfg.control == "tcp" else None
                            try:
                                agents[c] = _one_rep(pair, run, agents.get(c, []), loss,
                                                     round_timeout, start, traffic)
                            finally:
                                if tcp0 is not None:  # agent start-up/warm-up included
                                    tcp1 = pair.tcp_counters()
                                    run.tcp = {k: run.tcp.get(k, 0) + tcp1[k] - tcp0[k]
                                               for k in tcp1}
                                machine.stop()
                except BaseException:
                    # Keep what this loss measured so far (rows with fewer repetitions).
                    for c, run in enumerate(runs):
                        if run.stats or run.errors:
                            finish(c, run)
                    raise
                for c, run in enumerate(runs):
                    finish(c, run)
        finally:
            for group in agents.values():
                for a in group:
                    a.stop()
    made = rows[first_row:]  # measured loss by loss; listed config by config
    rows[first_row:] = [made[li * len(configs) + c]
                        for c in range(len(configs)) for li in range(len(losses))]
    return doc


class _RowRun:
    """One config's repetitions at one loss, gathered between the other configs' turns."""

    __slots__ = ("cfg", "stats", "errors", "timeouts", "cpu", "tcp")

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.stats: list[dict] = []
        self.errors: list[str] = []
        self.timeouts = 0
        self.cpu: dict[str, list[float]] = {side: [] for side in SIDES}
        self.tcp: dict[str, int] = {}

    @property
    def given_up(self) -> bool:
        """Two deadlines missed, more than rounds completed: the median is a timeout anyway."""
        return self.timeouts >= 2 and self.timeouts > len(self.stats)


def _one_rep(pair: NetnsPair, run: _RowRun, agents: list[Agent], loss: float,
             round_timeout: float, start, traffic: str = "all") -> list[Agent]:
    """One round trip of ``run``'s config under ``loss``; return its agents for the next.

    A round that misses its deadline counts as +inf in the median; its agents are
    stopped and the next repetition starts fresh ones (joined and warmed up on a
    clean link).
    """
    if not agents:
        pair.set_loss(0.0)
        agents = start(run.cfg)
    got, err, got_cpu = _rounds(agents, 1, round_timeout, run.cfg,
                                before_go=functools.partial(pair.set_loss, loss,
                                                            traffic=traffic))
    pair.set_loss(0.0)
    if err or not got:
        run.errors.append(err or "no stats")
        run.timeouts += 1
        for a in agents:
            a.stop()
        return []
    run.stats += got
    for side, c in got_cpu.items():
        run.cpu[side].append(c)
    return agents



def _start(pair: NetnsPair, cfg: Config, numel, rate_bps, round_timeout, port,
           prototype_settings: dict | None = None) -> list[Agent]:
    """Start ``cfg``'s two agents; a DBLP row with the prototype's costs gets
    ``prototype_settings`` (``dblp.TransportConfig`` keywords) beside its bound."""
    if cfg.impl == "gloo":
        base = {"kind": "gloo", "master": pair.ip[0], "port": port, "numel": numel,
                "round_timeout": round_timeout}
        agents = [Agent(pair, 0, dict(base, rank=0, ifname=pair.dev[0])),
                  Agent(pair, 1, dict(base, rank=1, ifname=pair.dev[1]))]
        ready_timeout = 120
    else:
        knobs = {"p": cfg.bound} if cfg.policy == "static" else {}
        if cfg.costs == "prototype":
            knobs.update(prototype_settings or {})
        base = {"kind": "dblp", "policy": cfg.policy, "knobs": knobs, "control": cfg.control,
                "rate_bps": rate_bps, "round_timeout": round_timeout, "port": port,
                "numel": numel, "session": int(uuid.uuid4().int >> 65) | 1}
        secret = secrets.token_hex(32) if cfg.auth else None  # made by who starts the job
        if cfg.mode == "sharded":
            agents = [Agent(pair, 0, dict(base, role="peer", rank=0, server=pair.ip[0]), secret),
                      Agent(pair, 1, dict(base, role="peer", rank=1, server=pair.ip[0]), secret)]
        else:
            agents = [Agent(pair, 1, dict(base, role="server"), secret),
                      Agent(pair, 0, dict(base, role="worker", server=pair.ip[1]), secret)]
        ready_timeout = 60
    for a in agents:
        r = a.read(ready_timeout)
        if not r.get("ready"):
            for b in agents:
                b.stop()
            raise ExperimentFailed(f"bench transport: {cfg.label}: an agent failed to start: "
                                   f"{r.get('error')}")
    if cfg.impl == "dblp":  # join + one warm-up round on a clean link
        _, err, _ = _rounds(agents, 1, round_timeout, cfg)
        if err:
            for a in agents:
                a.stop()
            raise ExperimentFailed(f"bench transport: {cfg.label}: the warm-up round on a clean "
                                   f"link failed (rows above are complete): {err}")
    return agents


def _rounds(agents: list[Agent], n: int, round_timeout: float, cfg: Config, before_go=None):
    """Run ``n`` rounds; return (the worker's stats, error or None, CPU seconds per side).

    Each round: both agents prepare (copy their gradient), then ``before_go()``
    (the row's loss goes on), then both get "go" back to back, as close to one
    start as two pipes allow. The CPU dict maps ``SIDES`` names to each agent's
    CPU over the collectives (absent on failure).
    """
    stats: list[dict] = []
    cpu: dict[str, float] = {}
    for _ in range(n):
        for a in agents:
            a.send({"cmd": "prepare"})
        ready = [a.read(round_timeout + 30) for a in agents]
        err = "; ".join(r["error"] for r in ready if not r.get("ok")) or None
        if err:
            return stats, err, cpu
        if before_go is not None:
            before_go()
        for a in agents:
            a.send({"cmd": "go"})
        replies = [a.read(round_timeout + 30) for a in agents]
        # whose clock: gloo rank 0, the PS worker, sharded rank 0 (all in namespace a)
        worker = replies[1] if (cfg.impl == "dblp" and cfg.mode == "ps") else replies[0]
        err = "; ".join(r["error"] for r in replies if not r.get("ok")) or None
        if err:
            return stats, err, cpu
        stats += worker.get("stats", [])
        for a, r in zip(agents, replies, strict=True):
            cpu[SIDES[a.side]] = cpu.get(SIDES[a.side], 0.0) + r["cpu_s"]
    return stats, None, cpu



def fractions(text: str, option: str) -> tuple[float, ...]:
    """``--losses``/``--bounds``: comma-separated fractions in [0, 1), or a usage error naming
    ``option`` (shared with `testbed.bench.collectives`, whose axes are the same)."""
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise click.BadParameter("must be comma-separated numbers", param_hint=option) from None
    if any(not 0 <= x < 1 for x in values):
        raise click.BadParameter("every value must be in [0, 1)", param_hint=option)
    return values


@click.command("transport")
@json_option
@click.option("--reps", type=int, default=5, show_default=True, help="Round trips per row (median).")
@click.option("--losses", default=",".join(f"{x:g}" for x in DEFAULT_LOSSES), show_default=True,
              help="Comma-separated loss fractions.")
@rate_option("rate_mbit", 100.0, "Shaped rate of the veth pair (HTB).", old_names=("--rate-mbit",))
@click.option("--mbytes", type=float, default=4.0, show_default=True, help="Gradient size (MiB).")
@click.option("--controls", default="udp,tcp", show_default=True,
              help="Control paths of the DBLP rows, comma-separated: udp and/or tcp.")
@click.option("--bounds", default="0,0.008,0.408", show_default=True,
              help="Loss bounds of the DBLP rows (0: reliable), comma-separated fractions in [0, 1).")
@click.option("--no-gloo", is_flag=True, help="Skip the torch.distributed gloo rows.")
@click.option("--no-sharded", is_flag=True, help="Skip the DBLP sharded-mode rows.")
@click.option("--auth", type=click.Choice(["both", "on", "off"]), default="both",
              show_default=True, help="DBLP rows with a job secret (MAC on every message), "
              "without, or both side by side.")
@click.option("--round-timeout", type=float, default=30.0, show_default=True,
              help="Per-round deadline; a row that misses it is reported as failed.")
@click.option("--loss-on", "traffic", type=click.Choice(TRAFFIC), default="all", show_default=True,
              help="Which packets the loss takes: all, the transport's DATA datagrams only, "
                   "or its control path only (controllers.traffic).")
@click.option("--costs", type=click.Choice([*COSTS, "both"]), default="ours", show_default=True,
              help="What the DBLP rows' passes cost: this transport's own settings, the "
                   f"authors' prototype's ({PROTOTYPE_COSTS[0].adds}: the first step of the "
                   "README's cost table), or both side by side.")
@click.option("--quick", is_flag=True,
              help="Short run for tests: 1 MiB, 2 reps, losses 0 and 0.5, UDP, no gloo, "
                   "authenticated.")
def transport_cmd(json_out, reps, losses, rate_mbit, mbytes, controls, bounds, no_gloo,
                  no_sharded, auth, round_timeout, traffic, costs, quick):
    """DBLP push+pull vs gloo all-reduce on an HTB-shaped veth pair (needs root)."""
    if os.geteuid() != 0:
        raise click.UsageError("bench transport needs root (network namespaces)")
    loss_list, bound_list = fractions(losses, "--losses"), fractions(bounds, "--bounds")
    ctl = tuple(c.strip() for c in controls.split(","))
    if any(c not in ("udp", "tcp") for c in ctl):
        raise click.BadParameter("controls are udp and/or tcp", param_hint="--controls")
    if reps < 1:
        raise click.BadParameter("must be >= 1", param_hint="--reps")
    if quick:
        reps, loss_list, mbytes, ctl, no_gloo, no_sharded = 2, (0.0, 0.5), 1.0, ("udp",), True, True
        auth = "on"
        bound_list = (0.0, 0.408)
    numel = int(mbytes * (1 << 20)) // 4
    cfgs = default_configs(bound_list, ctl, gloo=not no_gloo,
                           sharded=not no_sharded and "udp" in ctl,
                           auth={"both": (False, True), "on": (True,), "off": (False,)}[auth],
                           costs=COSTS if costs == "both" else (costs,))
    prototype = prototype_costs() if costs != "ours" else None
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the namespaces are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    output.say(HEADER)
    rows: list[dict] = []
    try:
        doc = run_bench(loss_list, reps, numel, rate_mbit * 1e6, cfgs, round_timeout,
                        log=output.say, rows=rows, traffic=traffic, prototype=prototype)
    except ExperimentFailed as e:
        # Keep what was measured: the rows before the failure, and the failure itself.
        if json_out:
            partial = bench_doc(loss_list, reps, numel, rate_mbit * 1e6, rows, traffic,
                                prototype)
            results({**partial, "failed": str(e)}, json_out, lambda: None)
        raise
    results(doc, json_out, lambda: click.echo(format_table(doc)))

