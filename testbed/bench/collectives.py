"""`dblp-testbed bench collectives`: all_reduce, all_gather and reduce_scatter over DBLP and gloo,
swept over sizes as nccl-tests sweeps them, on the transport bench's shaped veth pair.

The set-up is `bench transport`'s (`testbed.bench.transport`): two network
namespaces joined by an HTB-shaped veth pair (`testbed.emulation.netns.NetnsPair`),
receive offload on for a loss-free point and off for a lossy one, and a loss
``p`` that nftables applies to every UDP and TCP packet in both directions,
between the repetitions' "prepare" and "go", so warm-up calls and buffers meet
a clean link. Each transport is a torch.distributed group of two ranks, one
per namespace (`testbed.bench.collective_agent`, driven through the transport
bench's `testbed.bench.agents.Agent`): DBLP through its torch backend
(`dblp.torch_backend`), which runs sharded mode (every rank aggregates half of
each tensor; it needs no parameter server, and its all_gather and
reduce_scatter are defined only there), once per ``--bounds`` value, beside
gloo. A transport's two agents live for the whole bench (restarted after a
failure), so each DBLP stream joins once, in the warm-up.

The document, its rows and nccl-tests' columns are `testbed.bench.collectives_doc`.
"""
from __future__ import annotations

import functools
import os
import secrets
import signal
import sys
from collections.abc import Callable

import click

from testbed import output
from testbed.bench.agents import Agent
from testbed.bench.collectives_doc import (
    COLLECTIVES,
    HEADER,
    WORLD_SIZE,
    Transport,
    bench_doc,
    bench_row,
    format_row,
    format_table,
    parse_size,
    row_order,
    sweep,
    transports,
)
from testbed.bench.transport import fractions
from testbed.bench.transport_doc import LOSS_APPLIES_TO, OFFLOADS, OFFLOADS_SOFTWARE
from testbed.cpustat import CpuTally
from testbed.emulation.netns import NetnsPair
from testbed.errors import ExperimentFailed
from testbed.options import rate_option
from testbed.output import json_option, results

__all__ = ["Transport", "collectives_cmd", "run_bench", "transports"]

#: The agents' module (`testbed.bench.collective_agent`), started by `Agent` in each namespace.
AGENT = "testbed.bench.collective_agent"
#: Seconds an agent may take to import torch and join its group (two at once on two cores).
READY_TIMEOUT = 120.0


class _RowRun:
    """One transport's repetitions at one point (loss, size, collective), between the others'."""

    __slots__ = ("transport", "reps", "errors", "timeouts")

    def __init__(self, transport: Transport):
        self.transport = transport
        self.reps: list[list[dict]] = []  # per good repetition, each rank's stats
        self.errors: list[str] = []
        self.timeouts = 0

    @property
    def given_up(self) -> bool:
        """Two deadlines missed, more than repetitions completed: the median is a timeout anyway."""
        return self.timeouts >= 2 and self.timeouts > len(self.reps)


def run_bench(sizes: list[int], collectives=tuple(COLLECTIVES), transports_=None,
              losses=(0.0,), reps: int = 5, warmup: int = 1, rate_bps: float = 1e9,
              round_timeout: float = 60.0, factor: int = 2, log=print,
              rows: list[dict] | None = None) -> dict:
    """Run every transport on every collective and size at every loss; return the JSON document.

    Repetitions interleave as `bench transport`'s do: at each loss, size and
    collective, repetition k of every transport runs before repetition k+1 of
    any, so the transports a row compares meet the same machine, and each row
    is charged the CPU busy and steal of its own repetitions. Each finished row
    is appended to ``rows`` (the caller's list, if given), and on a failure
    every row with a measured repetition, so a bench that fails part way keeps
    what it measured. A finished document lists rows as nccl-tests prints
    blocks: by collective, transport, loss, then size.
    """
    transports_ = transports_ or transports()
    rows = [] if rows is None else rows
    first_row = len(rows)
    doc = bench_doc(sizes, factor, collectives, transports_, losses, reps, warmup, rate_bps, rows,
                    LOSS_APPLIES_TO["all"], OFFLOADS)
    port = [47200]
    prepare_timeout = (warmup + 1) * round_timeout + 30  # the warm-up calls, a stream's join

    def start(t: Transport) -> list[Agent]:
        port[0] += 1
        return _start(pair, t, rate_bps, round_timeout, port[0])

    agents: dict[Transport, list[Agent]] = {}
    with NetnsPair(rate_bps) as pair:
        if not pair.checksum_offload:
            doc["offloads"] = OFFLOADS_SOFTWARE
        try:
            for loss in losses:
                pair.set_gro(loss <= 0)  # receive offload wherever the loss hook allows it
                for size in sizes:
                    for collective in collectives:
                        fields = {"collective": collective, "size": size, "warmup": warmup}
                        runs = [_RowRun(t) for t in transports_]
                        tallies = [CpuTally() for _ in transports_]

                        def finish(run: _RowRun, tally: CpuTally, loss=loss, size=size,
                                   collective=collective) -> None:
                            row = bench_row(run.transport, collective, size, loss, run.reps,
                                            run.timeouts, run.errors, round_timeout)
                            row["cpu_busy_frac"] = tally.busy_fraction()
                            row["cpu_steal_frac"] = tally.steal_fraction()
                            row["gro"] = pair.gro
                            rows.append(row)
                            log(format_row(row))

                        try:
                            for _ in range(reps):
                                for run, tally in zip(runs, tallies, strict=True):
                                    if run.given_up:
                                        continue
                                    tally.start()
                                    try:
                                        agents[run.transport] = _one_rep(
                                            pair, run, agents.get(run.transport, []), fields,
                                            loss, prepare_timeout, round_timeout, start)
                                    finally:
                                        tally.stop()
                        except BaseException:
                            for run, tally in zip(runs, tallies, strict=True):
                                if run.reps or run.errors:
                                    finish(run, tally)
                            raise
                        for run, tally in zip(runs, tallies, strict=True):
                            finish(run, tally)
        finally:
            for group in agents.values():
                for a in group:
                    a.stop()
    rows[first_row:] = sorted(rows[first_row:],
                              key=row_order(collectives, [t.label for t in transports_]))
    return doc


def _one_rep(pair: NetnsPair, run: _RowRun, agents: list[Agent], fields: dict, loss: float,
             prepare_timeout: float, round_timeout: float,
             start: Callable[[Transport], list[Agent]]) -> list[Agent]:
    """One timed call of ``run``'s transport under ``loss``; return its agents for the next.

    A failed call (an error, a missed deadline) counts as infinitely slow in the
    row's median; its agents are stopped (a failed DBLP group fails every later
    collective) and the next repetition starts fresh ones.
    """
    if not agents:
        agents = start(run.transport)
    before_go = functools.partial(pair.set_loss, loss) if loss > 0 else None
    try:
        got, err = _exchange(agents, fields, prepare_timeout, round_timeout, before_go)
    finally:
        if loss > 0:
            pair.set_loss(0.0)
    if err or not got:
        run.errors.append(err or "no stats")
        run.timeouts += 1
        for a in agents:
            a.stop()
        return []
    run.reps.append(got)
    return agents


def _exchange(agents: list[Agent], fields: dict, prepare_timeout: float, round_timeout: float,
              before_go: Callable[[], None] | None = None) -> tuple[list[dict] | None, str | None]:
    """One call on every rank: (each rank's stats, or None; the error, or None).

    Both agents prepare (the point's buffers, warm-up calls where it is new),
    then ``before_go()`` (the loss goes on), then both get "go" back to back,
    as close to one start as two pipes allow.
    """
    for a in agents:
        a.send({"cmd": "prepare", **fields})
    ready = [a.read(prepare_timeout) for a in agents]
    err = "; ".join(r["error"] for r in ready if not r.get("ok")) or None
    if err:
        return None, err
    if before_go is not None:
        before_go()
    for a in agents:
        a.send({"cmd": "go"})
    replies = [a.read(round_timeout + 30) for a in agents]
    err = "; ".join(r["error"] for r in replies if not r.get("ok")) or None
    if err:
        return None, err
    return [r["stats"][0] for r in replies], None


def _start(pair: NetnsPair, t: Transport, rate_bps: float, round_timeout: float,
           port: int) -> list[Agent]:
    """Start ``t``'s two ranks (rank 0 in namespace a hosts the group's store) and wait for both."""
    base = {"impl": t.impl, "master": pair.ip[0], "port": port, "world": WORLD_SIZE,
            "round_timeout": round_timeout}
    if t.impl == "dblp":
        base.update(policy=t.policy, knobs={"p": t.bound} if t.policy == "static" else {},
                    rate_bps=rate_bps)
    secret = secrets.token_hex(32) if t.auth else None  # made by who starts the job
    agents = [Agent(pair, side, dict(base, rank=side, ifname=pair.dev[side]), secret,
                    module=AGENT) for side in (0, 1)]
    for a in agents:
        r = a.read(READY_TIMEOUT)
        if not r.get("ready"):
            for b in agents:
                b.stop()
            raise ExperimentFailed(f"bench collectives: {t.label}: an agent failed to start: "
                                   f"{r.get('error')}")
    return agents


def _sizes(begin: str, end: str, factor: int) -> list[int]:
    try:
        return sweep(parse_size(begin), parse_size(end), factor)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="-b/-e/-f") from None


def _collectives(text: str) -> tuple[str, ...]:
    names = tuple(c.strip() for c in text.split(","))
    unknown = [c for c in names if c not in COLLECTIVES]
    if unknown or not names:
        raise click.BadParameter(f"{unknown[0] if unknown else text!r}: choose from "
                                 f"{', '.join(COLLECTIVES)}", param_hint="--collectives")
    return names


@click.command("collectives")
@json_option
@click.option("-b", "--begin", default="1M", show_default=True, metavar="SIZE",
              help="Smallest array (bytes; K, M, G are 1024-based), as nccl-tests' -b.")
@click.option("-e", "--end", default="64M", show_default=True, metavar="SIZE",
              help="Largest array, as nccl-tests' -e.")
@click.option("-f", "--factor", type=int, default=2, show_default=True,
              help="Multiplication factor between sizes, as nccl-tests' -f.")
@click.option("--collectives", "names", default=",".join(COLLECTIVES), show_default=True,
              help="Collectives to run, comma-separated.")
@click.option("--bounds", default="0", show_default=True,
              help="Loss bounds of the DBLP rows (0: reliable), comma-separated fractions in [0, 1).")
@click.option("--no-gloo", is_flag=True, help="Skip the torch.distributed gloo rows.")
@click.option("--losses", default="0", show_default=True,
              help="Comma-separated loss fractions: every point of the sweep at each.")
@rate_option("rate_mbps", 1000.0, "Shaped rate of the veth pair (HTB).")
@click.option("-n", "--reps", type=int, default=5, show_default=True,
              help="Timed calls per row (median), as nccl-tests' -n.")
@click.option("-w", "--warmup", type=int, default=1, show_default=True,
              help="Untimed calls per transport before a new size or collective, as "
                   "nccl-tests' -w (a DBLP stream joins in its first).")
@click.option("--auth", is_flag=True, help="DBLP rows with a job secret (a MAC on every message).")
@click.option("--round-timeout", type=float, default=60.0, show_default=True,
              help="Per-call deadline; a row that misses it twice is reported as failed.")
@click.option("--quick", is_flag=True,
              help="Short run for tests: 256K and 1M, 2 reps, losses 0 and 0.1, DBLP reliable "
                   "and P=40.8 % beside gloo.")
def collectives_cmd(json_out, begin, end, factor, names, bounds, no_gloo, losses, rate_mbps, reps,
                    warmup, auth, round_timeout, quick):
    """nccl-tests' size sweep of all_reduce, all_gather, reduce_scatter: DBLP vs gloo (needs root)."""
    if os.geteuid() != 0:
        raise click.UsageError("bench collectives needs root (network namespaces)")
    loss_list, bound_list = fractions(losses, "--losses"), fractions(bounds, "--bounds")
    if reps < 1:
        raise click.BadParameter("must be >= 1", param_hint="--reps")
    if warmup < 0:
        raise click.BadParameter("must be >= 0", param_hint="--warmup")
    if quick:
        begin, end, factor, reps, loss_list, bound_list = "256K", "1M", 4, 2, (0.0, 0.1), (0.0, 0.408)
        no_gloo, round_timeout = False, 30.0
    sizes = _sizes(begin, end, factor)
    chosen = _collectives(names)
    ts = transports(bound_list, gloo=not no_gloo, auth=auth)
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the namespaces are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    output.say(HEADER)
    rows: list[dict] = []
    try:
        doc = run_bench(sizes, chosen, ts, loss_list, reps, warmup, rate_mbps * 1e6, round_timeout,
                        factor, log=output.say, rows=rows)
    except ExperimentFailed as e:
        # Keep what was measured: the rows before the failure, and the failure itself.
        if json_out:
            partial = bench_doc(sizes, factor, chosen, ts, loss_list, reps, warmup,
                                rate_mbps * 1e6, rows, LOSS_APPLIES_TO["all"], OFFLOADS)
            results({**partial, "failed": str(e)}, json_out, lambda: None)
        raise
    results(doc, json_out, lambda: click.echo(format_table(doc)))
