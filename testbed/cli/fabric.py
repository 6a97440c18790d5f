"""CLI commands about the fabric: doctor, net check/cli, clean, burst, bench bursts.

`testbed.cli` registers each by name and imports this module only when one runs.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import tomllib

import click

from controllers.bursts import KINDS
from testbed import output
from testbed.cli.choices import RegistryChoice
from testbed.cli.lazy import LazyGroup
from testbed.errors import ExperimentFailed, InputError
from testbed.options import rate_option
from testbed.output import json_option, results
from topologies import TOPOLOGIES


def _sigterm_as_interrupt():
    """SIGTERM tears the fabric down like Ctrl-C does."""
    def handler(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def process_age_s() -> float:
    """Seconds since this process started (so startup includes interpreter and imports)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _topology(topo, k):
    """The ``--topo`` graph; ``--k`` goes to a kind that declares a knob k (the fat-tree)."""
    from topologies import make_topology
    return make_topology(topo, **({"k": k} if "k" in TOPOLOGIES[topo].KNOBS else {}))


def _run_dir(out, what):
    if out:
        os.makedirs(out, exist_ok=True)
        return out
    return tempfile.mkdtemp(prefix=f"dblp-{what}-")


topo_option = click.option("--topo", type=RegistryChoice(TOPOLOGIES, sorted), default="fattree",
                           show_default=True, help="Topology from the registry.")
k_option = click.option("--k", type=int, default=4, show_default=True,
                        help="Fat-tree arity (even, 4..8).")
bw_option = rate_option("bw", 20.0, "Shaped rate of every link (HTB).", old_names=("--bw",))
queue_option = click.option("--queue", type=int, default=100, show_default=True, metavar="PKTS",
                            help="Bounded drop-tail queue per port (pfifo limit).")


@click.command()
@json_option
def doctor(json_out):
    """What this machine can emulate, and why not."""
    from testbed.emulation.capabilities import check
    rep = check()

    def text():
        click.echo(f"root: {rep['root']}   OVS running: {rep['ovs_running']}   "
                   f"datapath: {rep['datapath']}")
        click.echo("tools: " + " ".join(f"{t}{'' if ok else '(MISSING)'}" for t, ok in rep["tools"].items()))
        click.echo("python: " + " ".join(f"{m}{'' if ok else '(MISSING)'}"
                                         for m, ok in rep["modules"].items()))
        click.echo("qdiscs: " + " ".join(f"{q}{'' if ok else '(no)'}" for q, ok in rep["qdiscs"].items()))
        click.echo(f"nftables netdev egress: {rep['nft_netdev_egress']}   "
                   f"wmem_default: {rep['wmem_default']}")
        core = rep["c_core"]
        click.echo("dblp C core: " + (f"loaded ({core['path']}; keyed jobs' tags: "
                                      f"{core.get('mac') or 'in Python'})" if core["loaded"]
                                      else f"NOT loaded ({core['error']})"))
        for p in rep["problems"]:
            click.echo(f"PROBLEM: {p}")
        for n in rep["notes"]:
            click.echo(f"note: {n}")
        click.echo("ok: the fabric can be built" if rep["ok"] else "not ok")
    results(rep, json_out, text)
    sys.exit(0 if rep["ok"] else 1)


@click.group(cls=LazyGroup)
def net():
    """Build the routed fabric and check or explore it."""


@net.command("check")
@topo_option
@k_option
@bw_option
@queue_option
@click.option("--goodput-s", type=float, default=5.0, show_default=True,
              help="iperf3 duration for the TCP goodput check (0: skip).")
@click.option("--flows", type=int, default=1, show_default=True,
              help="Concurrent cross-pod TCP flows (disjoint host pairs).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run directory for logs (default: a fresh temporary one).")
@json_option
def net_check(topo, k, bw, queue, goodput_s, flows, out, json_out):
    """Build the fabric; all-pairs reachability, core spread, TCP goodput, startup time."""
    t_process = time.monotonic() - process_age_s()
    _sigterm_as_interrupt()
    from testbed.emulation import netcheck
    from testbed.emulation.fabric import Fabric
    try:
        graph = _topology(topo, k)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    run_dir = _run_dir(out, "netcheck")
    res = {"topology": graph.name, "hosts": len(graph.hosts()), "switches": len(graph.switches()),
           "shaped_mbps": bw, "queue_pkts": queue, "run_dir": run_dir}
    with Fabric(graph, run_dir=run_dir, bw_mbps=bw, queue_pkts=queue,
                log=output.detail if json_out == output.JSON_STDOUT else None) as fab:
        res["startup_s"] = round(time.monotonic() - t_process, 2)
        res["fabric_startup_s"] = round(fab.startup_s, 2)
        res["datapath"] = fab.datapath
        # The first packet of every pair costs an ARP and an OVS upcall in the
        # one forwarding thread; at k=8 that storm drops ~2 % of cold probes.
        # Report the cold pass, then judge reachability on a second pass.
        cold = netcheck.all_pairs(fab, count=1)
        reach = netcheck.all_pairs(fab)
        res.update(pairs=reach["pairs"], pairs_ok=reach["pairs_ok"], unreachable=reach["failed"],
                   pairs_ok_cold=cold["pairs_ok"])
        spread = netcheck.core_spread(fab)
        res.update(core_switches=spread["core_switches"], core_switches_used=spread["core_switches_used"],
                   core_packets=spread["per_core"], core_flows=spread["flows"])
        if goodput_s > 0:
            g = netcheck.tcp_goodput(fab, netcheck.cross_pod_pairs(graph, flows), duration_s=goodput_s)
            res.update(tcp_goodput_mbps=round(g["total_mbps"] / g["flows"], 2),
                       tcp_goodput_total_mbps=g["total_mbps"], tcp_flows=g["per_flow_mbps"])
        else:
            res["tcp_goodput_mbps"] = None
    res["ok"] = res["pairs_ok"] == res["pairs"] and res["core_switches_used"] == res["core_switches"]

    def text():
        click.echo(f"{res['topology']}: {res['switches']} switches, {res['hosts']} hosts, "
                   f"{res['datapath']} datapath; routed {res['startup_s']} s after process start")
        click.echo(f"reachability: {res['pairs_ok']}/{res['pairs']} pairs "
                   f"({res['pairs_ok_cold']} on the first, cold probe)")
        click.echo(f"core spread: {res['core_switches_used']}/{res['core_switches']} core switches "
                   f"carry UDP flows with distinct ports {res['core_packets']}")
        if res["tcp_goodput_mbps"] is not None:
            click.echo(f"TCP goodput: {res['tcp_goodput_mbps']} Mbit/s per flow over {flows} flow(s) "
                       f"at {bw} Mbit/s shaping ({100 * res['tcp_goodput_mbps'] / bw:.0f} %)")
    results(res, json_out, text)
    sys.exit(0 if res["ok"] else 1)


@net.command("cli")
@topo_option
@k_option
@bw_option
@queue_option
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run directory for the fabric's logs and control socket "
                   "(default: a fresh temporary one).")
def net_cli(topo, k, bw, queue, out):
    """Open Mininet's CLI on the routed fabric (exit it to tear down)."""
    from mininet.cli import CLI

    from testbed.emulation.fabric import Fabric
    _sigterm_as_interrupt()
    with Fabric(_topology(topo, k), run_dir=_run_dir(out, "netcli"), bw_mbps=bw,
                queue_pkts=queue) as fab:
        click.echo(f"control socket: {fab.control_socket} (dblp-testbed burst --socket ...)")
        # The fabric keeps Mininet quiet while it builds; the CLI prints what
        # commands run in hosts print at the "output" level, so raise it back.
        from mininet.log import setLogLevel
        setLogLevel("output")
        try:
            CLI(fab.net)
        finally:
            setLogLevel("error")


@click.command()
@click.option("--dry-run", is_flag=True, help="List what would be removed.")
@click.option("--force", is_flag=True,
              help="Also tear down a live run's fabric (its recorded processes, bridges, tables).")
@json_option
def clean(dry_run, force, json_out):
    """Remove the project's leftovers: what dead runs recorded, dt* bridges, veths, tables, and
    the namespaces of benches that died without removing them.

    A live run is left alone unless --force; processes are stopped only by
    the PIDs a run recorded, never by name.
    """
    from testbed.emulation import cleanup
    rep = cleanup.leftovers() if dry_run else cleanup.clean(force=force)

    def text():
        for k, v in rep.items():
            if k == "live":
                continue
            verb = "found (never stopped by name)" if k == "host_shells" else \
                "would remove" if dry_run else "removed"
            click.echo(f"{verb} {k}: {len(v)} {v[:10] if v else ''}")
        for what in rep["live"]:
            click.echo(f"left alone: live {what} (and any dt* name it may own); "
                       "use --force to tear it down")
    results(rep, json_out, text)


@click.command()
@click.option("--socket", "sock", default=None, metavar="PATH",
              help="Control socket (default: $DBLP_CONTROL_SOCKET, or RUN/control.sock with --run).")
@click.option("--run", "run_dir", default=None, type=click.Path(file_okay=False),
              help="Run directory of the running experiment.")
@click.option("--kind", type=RegistryChoice(KINDS), default="loss", show_default=True,
              help="Burst kind from the registry (controllers.bursts.KINDS).")
@click.option("--target", default="server-downlink", show_default=True,
              help="server-downlink, server-uplink, workerN-downlink, core-uplinks, SWITCH:NEIGHBOUR")
@click.option("--duration-ms", type=float, default=500.0, show_default=True,
              help="How long the burst lasts, in milliseconds.")
@click.option("--p", type=float, default=None,
              help=f"loss: drop probability (default {KINDS['loss'].params['p'].default}).")
@click.option("--rate-mbps", type=float, default=None, help="police: meter rate; congest: cross rate.")
@click.option("--param", "knobs", multiple=True, metavar="KNOB=VALUE",
              help="Any other knob of the kind (its params), e.g. --param pkt_bytes=800 (repeatable).")
@click.option("--status", is_flag=True, help="Only print the controller's status.")
def burst(sock, run_dir, kind, target, duration_ms, p, rate_mbps, knobs, status):
    """Trigger a burst by hand on a running experiment's controller.

    Prints the controller's reply as one JSON line; exit 1 if it refused.
    The kind checks its own knobs (`controllers.kinds`), so a registered
    kind's knobs go through ``--param`` unchanged.
    """
    from controllers.bursts import BurstError
    from controllers.protocol import BurstRequest, ControlClient, ProtocolError, StatusRequest
    path = sock or (os.path.join(run_dir, "control.sock") if run_dir else None) or \
        os.environ.get("DBLP_CONTROL_SOCKET")
    if not path:
        raise click.UsageError("no control socket: give --socket, --run or set DBLP_CONTROL_SOCKET")
    params = {k: v for k, v in (("p", p), ("rate_mbps", rate_mbps)) if v is not None}
    for text in knobs:
        key, sep, raw = text.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--param {text!r} is not KNOB=VALUE; write e.g. --param pkt_bytes=800")
        try:
            params[key.strip()] = tomllib.loads(f"v = {raw}")["v"]   # values are TOML, as --set's
        except tomllib.TOMLDecodeError:
            params[key.strip()] = raw   # a bare word: the kind's own check names the knob
    try:
        request = StatusRequest() if status else BurstRequest(kind, target, duration_ms, params)
    except BurstError as exc:
        raise InputError(f"burst {exc}") from None
    try:
        with ControlClient(path) as client:
            reply = client.send(request)
    except (OSError, ProtocolError) as exc:
        raise InputError(f"cannot reach the controller at {path}: {exc}") from None
    click.echo(json.dumps(reply.to_dict()))
    if not reply.ok:
        raise ExperimentFailed(f"the controller refused the request: {reply.error}")


@click.command("bursts")
@k_option
@bw_option
@queue_option
@click.option("--tries", type=int, default=20, show_default=True, help="Round-trigger tries.")
@json_option
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run directory for the fabric's logs (default: a fresh temporary one).")
def bench_bursts(k, bw, queue, tries, json_out, out):
    """Requested vs measured burst loss and timing on the fat-tree (paced UDP through the target)."""
    from testbed.bench.bursts import run_bench
    from testbed.emulation.fabric import Fabric
    _sigterm_as_interrupt()
    with Fabric(_topology("fattree", k), run_dir=_run_dir(out, "benchbursts"), bw_mbps=bw,
                queue_pkts=queue) as fab:
        res = run_bench(fab, tries=tries)

    def text():
        click.echo(f"{'kind':<20}{'requested':>10}{'in window':>11}{'outside':>9}{'start lag ms':>14}"
                   f"{'mechanism ms':>14}")
        for r in res["rows"]:
            label = r["kind"] + (f" p={r['params']['p']}" if r.get("params", {}).get("p") else "")
            out_s = "-" if r["measured_outside"] is None else f"{r['measured_outside']:.4f}"
            mech = "-" if r.get("mechanism_lag_ms") is None else f"{r['mechanism_lag_ms']:.2f}"
            click.echo(f"{label:<20}{r['requested']:>10.3f}{r['measured_in_window']:>11.4f}{out_s:>9}"
                       f"{r['start_lag_ms']:>14.2f}{mech:>14}")
    results(res, json_out, text)

