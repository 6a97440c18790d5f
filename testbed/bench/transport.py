"""`dblp-testbed bench transport`: DBLP vs gloo on a shaped veth pair between two namespaces.

Two network namespaces ``dbt-<tag>-a`` (worker / gloo rank 0) and
``dbt-<tag>-b`` (aggregator / gloo rank 1) joined by a veth pair; each end's
egress is shaped with HTB (default 100 Mbit/s, pfifo child). Every
segmentation offload is off on both ends (TSO, GSO, and the veth's UDP
segmentation): the kernel cuts every TCP or UDP GSO packet before the veth,
so the shaper counts and the loss hook drops MTU-sized packets. TX checksum
offload is on, as on any NIC, so neither kernel checksums every byte in
software, for TCP and UDP alike (``NetnsPair.OFFLOADS``). The veth keeps UDP
segmentation on with checksum offload unless told otherwise: a UDP GSO
message of up to 44 datagrams then crossed it whole and was dropped or kept
whole (one run at 50 % loss: 0 resends in 57 chunks), so the pair checks the
setting took and falls back to checksums in software if it did not. Random loss is an nftables
``numgen random`` drop on the input hook of both namespaces, applied to every
UDP and TCP packet (data, control, gloo alike), so "loss p" means p in each
direction for everything. Receive offload (GRO) is on at both ends for a
loss-free row and off for a lossy one, whose drops must see every packet
(``NetnsPair.set_gro``); each row records which (``gro``). One round trip = push of the gradient to the
aggregator + pull of the aggregate (one DBLP round, measured at the worker);
gloo's row is one ``all_reduce`` of the same tensor between the same hosts.

Everything the bench creates is named ``dbt-*``/``dbt*`` and removed in
``finally`` (namespaces take their veths and nft tables with them).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
import uuid

import click

from testbed import REPO_ROOT, output
from testbed.cpustat import CpuTally
from testbed.errors import ExperimentFailed
from testbed.output import json_option, results

DEFAULT_LOSSES = (0.0, 0.01, 0.10, 0.50, 0.80)
DEFAULT_NUMEL = 1 << 20  # 4 MiB of float32
DEFAULT_RATE = 100e6
#: The two agents of a row by namespace: a = PS worker / sharded rank 0 / gloo rank 0,
#: b = aggregator / sharded rank 1 / gloo rank 1. Each sends and receives the gradient
#: once per round trip (push + pull, or the two halves of a ring all-reduce each way),
#: so each moves ``2 x bytes`` of payload: the denominator of ``cpu_s_per_gb_*``.
SIDES = ("worker", "server")


def _run(*cmd: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True, input=input)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip() or p.stdout.strip()}")
    return p


class NetnsPair:
    """Two namespaces joined by an HTB-shaped veth pair; removed on exit.

    ``set_loss(p, protocols)`` installs (or replaces) an nftables drop of a
    fraction ``p`` of incoming packets of those protocols in both namespaces.

    ``set_gro(on)`` turns receive offload (GRO) on or off at both ends. A veth
    with it on runs in NAPI mode and coalesces a run of one flow's packets
    before the stack sees them, as a real NIC does: TCP always, UDP for a
    socket that asks (``dblp.batch.UDP_GRO``). The loss hook sits behind GRO
    (nftables input), where it would drop a whole coalesced run at once, so a
    lossy link has it off: ``set_loss`` with ``p > 0`` turns it off first.
    """

    def __init__(self, rate_bps: float | None = DEFAULT_RATE, tag: str | None = None,
                 queue_packets: int = 1000):
        tag = tag or uuid.uuid4().hex[:6]
        self.tag = tag
        self.ns = (f"dbt-{tag}-a", f"dbt-{tag}-b")
        self.dev = (f"dbt{tag}a", f"dbt{tag}b")
        self.ip = ("10.201.0.1", "10.201.0.2")
        self.rate_bps = rate_bps
        self.queue_packets = queue_packets
        self.loss = 0.0
        self.gro = False
        self.checksum_offload = True  # False: checksums in software (see _set_offloads)
        self._created = False

    def __enter__(self) -> NetnsPair:
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def exec(self, side: int, *cmd: str, check: bool = True, input: str | None = None):
        return _run("ip", "netns", "exec", self.ns[side], *cmd, check=check, input=input)

    def create(self) -> None:
        a, b = self.ns
        self._created = True
        _run("ip", "netns", "add", a)
        _run("ip", "netns", "add", b)
        _run("ip", "link", "add", self.dev[0], "netns", a, "type", "veth", "peer", "name",
             self.dev[1], "netns", b)
        for side in (0, 1):
            dev = self.dev[side]
            self.exec(side, "ip", "link", "set", "lo", "up")
            self.exec(side, "ip", "addr", "add", f"{self.ip[side]}/30", "dev", dev)
            self.exec(side, "ip", "link", "set", dev, "up")
            self._set_offloads(side)
            if self.rate_bps:
                rate = f"{int(self.rate_bps)}bit"
                self.exec(side, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
                          "default", "10")
                self.exec(side, "tc", "class", "add", "dev", dev, "parent", "1:", "classid",
                          "1:10", "htb", "rate", rate, "ceil", rate)
                self.exec(side, "tc", "qdisc", "add", "dev", dev, "parent", "1:10", "handle",
                          "10:", "pfifo", "limit", str(self.queue_packets))

    #: ethtool -K settings: every segmentation offload off, TX checksum offload on.
    #: ``SOFTWARE_CHECKSUMS`` is the fallback where UDP segmentation would stay on.
    SOFTWARE_CHECKSUMS = ("tx", "off", "tso", "off", "gso", "off", "tx-udp-segmentation", "off")
    OFFLOADS = ("tx-udp-segmentation", "off", "tso", "off", "gso", "off", "tx", "on")

    def _set_offloads(self, side: int) -> None:
        """Checksum offload on and segmentation off at one end, or checksums in software.

        A kernel or ethtool that cannot turn the veth's UDP segmentation off
        while checksum offload is on would let GSO messages cross whole past
        the shaper and the loss hook: the pair then checksums in software (as
        it always did before) and says so.
        """
        dev = self.dev[side]
        self.exec(side, "ethtool", "-K", dev, *self.OFFLOADS, check=False)
        shown = self.exec(side, "ethtool", "-k", dev, check=False).stdout
        on = {line.split(":")[0].strip() for line in shown.splitlines()
              if line.split(":")[-1].split()[:1] == ["on"]}
        if on & {"tx-udp-segmentation", "tcp-segmentation-offload",
                 "generic-segmentation-offload"}:
            self.exec(side, "ethtool", "-K", dev, *self.SOFTWARE_CHECKSUMS, check=False)
            click.echo(f"bench: {dev} keeps a segmentation offload on with TX checksum "
                       "offload; checksums in software instead", err=True)
            on.discard("tx-checksumming")
        self.checksum_offload = self.checksum_offload and "tx-checksumming" in on

    def set_gro(self, on: bool) -> None:
        """Receive offload on or off at both ends (off whenever a loss is set)."""
        if on and self.loss > 0:
            raise ValueError("GRO would coalesce packets before the loss hook drops them; "
                             "set the loss to 0 first")
        if on != self.gro:
            for side in (0, 1):
                self.exec(side, "ethtool", "-K", self.dev[side], "gro", "on" if on else "off")
            self.gro = on

    def set_loss(self, p: float, protocols: str = "udp, tcp") -> None:
        """Drop a fraction ``p`` of incoming ``protocols`` packets in both namespaces."""
        if p > 0:
            self.set_gro(False)
        self.loss = p
        for side in (0, 1):
            self.exec(side, "nft", "delete", "table", "inet", "dbt", check=False)
            if p <= 0:
                continue
            per_million = int(round(p * 1_000_000))
            rules = f"""table inet dbt {{
    chain input {{
        type filter hook input priority 0; policy accept;
        meta l4proto {{ {protocols} }} numgen random mod 1000000 < {per_million} counter drop
    }}
}}
"""
            self.exec(side, "nft", "-f", "-", input=rules)

    def drop_counts(self) -> list[int]:
        out = []
        for side in (0, 1):
            p = self.exec(side, "nft", "list", "table", "inet", "dbt", check=False)
            n = 0
            for tok in p.stdout.split("packets")[1:]:
                n += int(tok.split()[0])
            out.append(n)
        return out

    TCP_COUNTERS = ("TcpExtTCPTimeouts", "TcpRetransSegs", "TcpExtTCPLossProbes")

    def tcp_counters(self) -> dict:
        """Kernel TCP counters summed over both namespaces (why TCP rows are slow)."""
        out = dict.fromkeys(self.TCP_COUNTERS, 0)
        for side in (0, 1):
            p = self.exec(side, "nstat", "-asz", *self.TCP_COUNTERS, check=False)
            for line in p.stdout.splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[0] in out:
                    out[parts[0]] += int(parts[1])
        return out

    def destroy(self) -> None:
        if not self._created:
            return
        for ns in self.ns:
            _run("ip", "netns", "del", ns, check=False)
        self._created = False


# -- agents (run inside a namespace, driven over stdin/stdout, one JSON per line) ----------

def _reply(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _agent_dblp(args: dict) -> None:
    import numpy as np

    import dblp
    role = args["role"]
    # The job's secret (auth rows) comes in the environment, never on the command line.
    cfg = dblp.TransportConfig(
        policy=args["policy"], control=args["control"], rate_bps=args["rate_bps"],
        round_timeout=args["round_timeout"], join_timeout=30.0,
        idle_timeout=args["round_timeout"] + 30, session_id=args["session"],
        mode="sharded" if role == "peer" else "ps",
        secret=os.environ.get(dblp.config.SECRET_ENV) or None, **args.get("knobs", {}))
    if role == "server":
        obj = dblp.ParameterServer("0.0.0.0", args["port"], 1, config=cfg)
    elif role == "peer":  # sharded mode, two ranks: each aggregates half
        obj = dblp.TransportGroup(args["rank"], 2, args["server"], args["port"], config=cfg)
        grad = np.random.default_rng(args["rank"]).standard_normal(args["numel"]).astype(np.float32)
    else:
        obj = dblp.TransportGroup(0, 1, args["server"], args["port"], config=cfg)
        grad = np.random.default_rng(1).standard_normal(args["numel"]).astype(np.float32)
    work: list = []

    def prepare() -> None:
        if role != "server":
            work[:] = [grad.copy()]

    def collective() -> dict:
        if role == "server":
            return obj.serve(1)[0].as_dict()
        return obj.allreduce_(work.pop()).as_dict()

    _serve_commands(prepare, collective)
    obj.close()


def _serve_commands(prepare, collective) -> None:
    """Say ready, then answer "prepare" and "go" command lines until "quit" or a failure.

    "prepare" makes the round's copy of the gradient; "go" runs the collective and
    replies its stats and the CPU seconds of this process (all threads, user +
    system) over the collective alone: waiting in select/recv costs none, and the
    copy is left out, for gloo as for DBLP. The driver sends "go" to both agents
    once both are prepared, so a round's time never includes how late the other
    agent read its command or copied its gradient, and it sets the row's loss in
    between, so the preparation runs on a clean link. A failure is reported to
    the driver, which restarts the agents."""
    _reply({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        try:
            if cmd["cmd"] == "prepare":
                prepare()
                _reply({"ok": True})
                continue
            c0 = time.process_time()
            stats = collective()
            _reply({"ok": True, "stats": [stats], "cpu_s": time.process_time() - c0})
        except Exception as exc:
            _reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            break


def _agent_gloo(args: dict) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    os.environ["GLOO_SOCKET_IFNAME"] = args["ifname"]
    dist.init_process_group("gloo", init_method=f"tcp://{args['master']}:{args['port']}",
                            rank=args["rank"], world_size=2,
                            timeout=datetime.timedelta(seconds=args["round_timeout"]))
    t = torch.randn(args["numel"], generator=torch.Generator().manual_seed(args["rank"]))
    dist.all_reduce(torch.zeros(1))
    dist.all_reduce(t.clone())  # warm-up: connections and buffers
    work: list = []

    def prepare() -> None:
        work[:] = [t.clone()]

    def collective() -> dict:
        x = work.pop()
        t0 = time.monotonic()
        dist.all_reduce(x)
        x /= 2
        return {"latency_s": time.monotonic() - t0}

    _serve_commands(prepare, collective)
    os._exit(0)  # a gloo group after a timeout can hang in its destructor


def agent_main(argv: list[str]) -> None:
    args = json.loads(argv[0])
    if args["kind"] == "gloo":
        _agent_gloo(args)
    else:
        _agent_dblp(args)


class Agent:
    """A process in a namespace that answers one JSON line per command."""

    def __init__(self, pair: NetnsPair, side: int, args: dict, secret: str | None = None):
        self.side = side  # 0: namespace a (worker / rank 0), 1: namespace b (aggregator / rank 1)
        root = str(REPO_ROOT)
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("DBLP_SECRET", None)
        if secret is not None:
            env["DBLP_SECRET"] = secret
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", pair.ns[side], sys.executable, "-m",
             "testbed.bench.transport", json.dumps(args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env, cwd=root)

    def send(self, obj) -> None:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the agent is gone: the next read() says why, with its stderr

    def read(self, timeout: float) -> dict:
        import select
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return {"ok": False, "error": f"agent silent for {timeout:.0f} s"}
            r, _, _ = select.select([self.proc.stdout], [], [], left)
            if r:
                line = self.proc.stdout.readline()
                if not line:
                    try:
                        self.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()  # closed its stdout but lives on: end it
                    # its last line: the exception that ended it (the traceback above it
                    # would make the one-line error many)
                    err = [x for x in self.proc.stderr.read().splitlines() if x.strip()]
                    return {"ok": False, "error": "agent exited: "
                            + (err[-1].strip() if err else f"code {self.proc.returncode}")}
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    continue

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"cmd": "quit"})
                self.proc.wait(timeout=3)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()
                self.proc.wait()


# -- the driver ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Config:
    impl: str  # "dblp" | "gloo"
    policy: str  # reliable | static
    bound: float
    control: str  # udp | tcp
    mode: str = "ps"  # dblp: "ps" (worker + aggregator) or "sharded" (two peers)
    auth: bool = False  # dblp: the job has a secret (every message carries a MAC)

    @property
    def label(self) -> str:
        if self.impl == "gloo":
            return "gloo all_reduce"
        return (f"{self.policy} P={self.bound:.1%} {self.control} {self.mode}"
                + (" auth" if self.auth else ""))


def default_configs(bounds=(0.0, 0.008, 0.408), controls=("udp", "tcp"), gloo=True,
                    sharded=True, auth=(False, True)):
    """Every bound x control (and sharded UDP), once per ``auth`` setting, side by side."""
    cfgs = []
    for control in controls:
        for b in bounds:
            for a in auth:
                cfgs.append(Config("dblp", "reliable" if b == 0 else "static", b, control,
                                   auth=a))
    if sharded:  # like gloo: both hosts send at once (UDP control; TCP is PS-only)
        for b in bounds:
            for a in auth:
                cfgs.append(Config("dblp", "reliable" if b == 0 else "static", b, "udp",
                                   "sharded", auth=a))
    if gloo:
        cfgs.append(Config("gloo", "reliable", 0.0, "tcp"))
    return cfgs


def ideal_passes(bound: float, loss: float, chunks: int) -> int:
    """ceil(ln P / ln p): passes a bounded round needs (reliable: until all K arrive)."""
    if loss <= 0:
        return 1
    target = bound if bound > 0 else 0.5 / chunks
    if target >= loss:
        return 1
    return max(1, math.ceil(math.log(target) / math.log(loss) - 1e-9))


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def run_bench(losses=DEFAULT_LOSSES, reps: int = 5, numel: int = DEFAULT_NUMEL,
              rate_bps: float = DEFAULT_RATE, configs=None, round_timeout: float = 30.0,
              log=print, rows: list[dict] | None = None) -> dict:
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
    """
    configs = configs or default_configs()
    rows = [] if rows is None else rows
    first_row = len(rows)  # this bench's rows start here: measured loss by loss
    doc = bench_doc(losses, reps, numel, rate_bps, rows)
    nbytes, floor_s, chunks = doc["bytes"], doc["floor_s"], doc["chunks"]
    port = [47000]
    # Made in the document's row order, before anything runs.
    tallies = {(c, loss): CpuTally() for c in range(len(configs)) for loss in losses}

    def start(cfg):
        port[0] += 1
        return _start(pair, cfg, numel, rate_bps, round_timeout, port[0])

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
                    row = _row(run.cfg, loss, run.stats, run.errors, run.timeouts, floor_s,
                               chunks, reps, round_timeout, cpu=run.cpu, moved_bytes=2 * nbytes)
                    # The row's round trips (agent restarts included): a busy or stolen CPU
                    # is a confound of every figure in it, and a reader cannot see it otherwise.
                    row["cpu_busy_frac"] = tallies[(c, loss)].busy_fraction()
                    row["cpu_steal_frac"] = tallies[(c, loss)].steal_fraction()
                    row["gro"] = pair.gro
                    if run.cfg.control == "tcp":
                        row["tcp"] = run.tcp
                    rows.append(row)
                    log(_format_row(row))

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
                                                     round_timeout, start)
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
             round_timeout: float, start) -> list[Agent]:
    """One round trip of ``run``'s config under ``loss``; return its agents for the next.

    A round that misses its deadline counts as +inf in the median; its agents are
    stopped and the next repetition starts fresh ones (joined and warmed up on a
    clean link).
    """
    if not agents:
        pair.set_loss(0.0)
        agents = start(run.cfg)
    got, err, got_cpu = _rounds(agents, 1, round_timeout, run.cfg,
                                before_go=functools.partial(pair.set_loss, loss))
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


#: The veths' offloads as a bench document states them (``NetnsPair._set_offloads``).
_GRO_ROWS = "; GRO on in loss-free rows (row 'gro')"
OFFLOADS = "TX checksum on, every segmentation offload off (TSO, GSO, UDP)" + _GRO_ROWS
OFFLOADS_SOFTWARE = "TX checksum and every segmentation offload off (the kernel did not keep " \
    "checksum offload on with UDP segmentation off)" + _GRO_ROWS

#: How the rows' round trips were ordered (``run_bench``); documents without it ran each row whole.
ORDER = "interleaved: repetition k of every row of a loss before repetition k+1 of any"


def bench_doc(losses, reps: int, numel: int, rate_bps: float, rows: list[dict]) -> dict:
    """The bench's JSON document around ``rows`` (all of them, or those a failed bench finished)."""
    from dblp.wire import CHUNK_ELEMS
    nbytes = numel * 4
    return {"floor_s": nbytes * 8 / rate_bps, "bytes": nbytes, "rate_bps": rate_bps,
            "chunks": -(-numel // CHUNK_ELEMS), "reps": reps, "losses": list(losses),
            "rows": rows,
            "loss_applies_to": "every UDP and TCP packet, both directions (nftables numgen)",
            "offloads": OFFLOADS, "order": ORDER}


def _start(pair: NetnsPair, cfg: Config, numel, rate_bps, round_timeout, port) -> list[Agent]:
    if cfg.impl == "gloo":
        base = {"kind": "gloo", "master": pair.ip[0], "port": port, "numel": numel,
                "round_timeout": round_timeout}
        agents = [Agent(pair, 0, dict(base, rank=0, ifname=pair.dev[0])),
                  Agent(pair, 1, dict(base, rank=1, ifname=pair.dev[1]))]
        ready_timeout = 120
    else:
        knobs = {"p": cfg.bound} if cfg.policy == "static" else {}
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


def _cpu_per_gb(cpu: dict[str, list[float]] | None, moved_bytes: int | None) -> dict:
    """Median CPU seconds per GB of payload each side moved (sent + received), by side.

    Why per GB: CPU per round grows with the gradient, CPU per byte is what says whether
    a data path can keep up with a faster link on this machine.
    """
    out = {}
    for side in SIDES:
        xs = (cpu or {}).get(side) or []
        out[f"cpu_s_per_gb_{side}"] = (statistics.median(xs) / (moved_bytes / 1e9)
                                       if xs and moved_bytes else None)
    return out


def _row(cfg: Config, loss: float, stats: list[dict], errors: list[str], timeouts: int,
         floor_s: float, chunks: int, reps: int, round_timeout: float, *,
         cpu: dict[str, list[float]] | None = None, moved_bytes: int | None = None) -> dict:
    p = loss
    if cfg.impl == "gloo":
        need = 1.0 / (1 - p)  # 2-rank ring: each rank sends the tensor once, both ways at once
        passes = None
        ideal = None
    elif cfg.mode == "sharded":
        need = (1 - cfg.bound) / (1 - p)  # each direction: half pushed + half pulled
        passes = _median([max(s["passes_push"], s["passes_pull"]) for s in stats])
        ideal = ideal_passes(cfg.bound, p, chunks)
    else:
        need = 2 * (1 - cfg.bound) / (1 - p)  # push + pull, same bound on both
        passes = _median([max(s["passes_push"], s["passes_pull"]) for s in stats])
        ideal = ideal_passes(cfg.bound, p, chunks)
    lat = sorted([s["latency_s"] for s in stats] + [math.inf] * timeouts)
    rt = statistics.median(lat) if lat else math.inf
    rt = None if math.isinf(rt) else rt
    bound_s = floor_s * need
    row = {"impl": cfg.impl, "policy": cfg.policy, "bound": cfg.bound, "control": cfg.control,
           "mode": cfg.mode if cfg.impl == "dblp" else "allreduce", "auth": cfg.auth,
           "loss": loss, "round_trip_s": rt, "bound_s": bound_s,
           "ratio": (rt / bound_s) if rt else None, "passes": passes, "ideal_passes": ideal,
           "reps": len(stats), "timeouts": timeouts, "round_timeout_s": round_timeout,
           "spread_s": [lat[0], lat[-1]] if lat and not math.isinf(lat[0]) else None,
           **_cpu_per_gb(cpu, moved_bytes)}
    if row["spread_s"] and math.isinf(row["spread_s"][1]):
        row["spread_s"][1] = None
    if cfg.impl == "dblp" and stats:
        row["passes_push"] = _median([s["passes_push"] for s in stats])
        row["passes_pull"] = _median([s["passes_pull"] for s in stats])
        row["probe_rounds"] = _median([s["probe_rounds"] for s in stats])
        row["missing_at_stop"] = _median([s["missing_at_stop"] for s in stats])
        row["pull_missing"] = _median([s["pull_missing"] for s in stats])
        row["rtt_ms"] = _median([(s["rtt_s"] or 0) * 1e3 for s in stats])
    if errors:
        row["errors"] = sorted(set(e[:300] for e in errors))
    return row


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


HEADER = (f"{'impl':7} {'policy':8} {'bound':>6} {'ctrl':4} {'auth':4} {'loss':>5} "
          f"{'round_trip_s':>12} {'bound_s':>8} {'ratio':>6} {'passes':>6} {'ideal':>5} "
          f"{'cpu_s/GB w':>10} {'cpu_s/GB s':>10} {'steal':>5}")


def _format_row(r: dict) -> str:
    impl = r["impl"] + ("/sh" if r.get("mode") == "sharded" else "")
    auth = "yes" if r.get("auth") else "no"
    s = (f"{impl:7} {r['policy']:8} {r['bound']:6.1%} {r['control']:4} {auth:4} {r['loss']:5.0%} "
         f"{_fmt(r['round_trip_s'], '12.3f')} {r['bound_s']:8.3f} {_fmt(r['ratio'], '6.2f')} "
         f"{_fmt(r['passes'], '6.0f')} {_fmt(r['ideal_passes'], '5d')} "
         f"{_fmt(r.get('cpu_s_per_gb_worker'), '10.2f')} "
         f"{_fmt(r.get('cpu_s_per_gb_server'), '10.2f')} "
         f"{_fmt(r.get('cpu_steal_frac'), '5.1%')}")
    if r.get("tcp"):
        s += f"  tcp RTOs {r['tcp']['TcpExtTCPTimeouts']}"
    if r.get("timeouts"):
        s += (f"  ({r['timeouts']} of {r['reps'] + r['timeouts']} missed the "
              f"{r['round_timeout_s']:g} s deadline)")
    return s


def format_table(doc: dict) -> str:
    lines = [f"floor_s = {doc['floor_s']:.3f} s ({doc['bytes']} B at {doc['rate_bps'] / 1e6:g} "
             f"Mbit/s), medians of {doc['reps']} round trips; cpu_s/GB: CPU seconds per GB "
             "each side moved (w = worker / rank 0, s = aggregator / rank 1); steal: CPU "
             "time the hypervisor gave other guests during the row", HEADER]
    lines += [_format_row(r) for r in doc["rows"]]
    lines += ["", "cost of authentication (round trip with a secret / without, same row):"]
    for r in doc["rows"]:
        twin = _auth_twin(doc, r)
        if r.get("auth") and twin and r["round_trip_s"] and twin["round_trip_s"]:
            lines.append(f"  {r['policy']:8} {r['bound']:6.1%} {r['control']} {r['mode']:7} "
                         f"loss {r['loss']:4.0%}: {r['round_trip_s'] / twin['round_trip_s']:.3f}x")
    lines += ["", "speedup of the 40.8 % bound over static 0.8 % (same control):"]
    for control in ("udp", "tcp"):
        for loss in doc["losses"]:
            a = _find(doc, "static", 0.008, control, loss)
            b = _find(doc, "static", 0.408, control, loss)
            if not (a and b and b["round_trip_s"]):
                continue
            if a["round_trip_s"]:
                lines.append(f"  {control} loss {loss:4.0%}: "
                             f"{a['round_trip_s'] / b['round_trip_s']:.2f}x")
            else:
                lines.append(f"  {control} loss {loss:4.0%}: > "
                             f"{a['round_timeout_s'] / b['round_trip_s']:.1f}x (static 0.8 % "
                             "missed the deadline)")
    return "\n".join(lines)


def _find(doc, policy, bound, control, loss, auth=False):
    for r in doc["rows"]:
        if r["impl"] == "dblp" and r.get("mode", "ps") == "ps" and r["policy"] == policy \
                and abs(r["bound"] - bound) < 1e-9 \
                and r["control"] == control and r["loss"] == loss and r.get("auth", False) == auth:
            return r
    return None


def _auth_twin(doc, row):
    """The row measured under the same conditions without authentication."""
    for r in doc["rows"]:
        if r is not row and r["impl"] == row["impl"] == "dblp" and not r.get("auth") \
                and (r["policy"], r["bound"], r["control"], r["mode"], r["loss"]) == \
                (row["policy"], row["bound"], row["control"], row["mode"], row["loss"]):
            return r
    return None


@click.command("transport")
@json_option
@click.option("--reps", type=int, default=5, show_default=True, help="Round trips per row (median).")
@click.option("--losses", default=",".join(f"{x:g}" for x in DEFAULT_LOSSES), show_default=True,
              help="Comma-separated loss fractions.")
@click.option("--rate-mbit", type=float, default=100.0, show_default=True)
@click.option("--mbytes", type=float, default=4.0, show_default=True, help="Gradient size (MiB).")
@click.option("--controls", default="udp,tcp", show_default=True)
@click.option("--bounds", default="0,0.008,0.408", show_default=True)
@click.option("--no-gloo", is_flag=True, help="Skip the torch.distributed gloo rows.")
@click.option("--no-sharded", is_flag=True, help="Skip the DBLP sharded-mode rows.")
@click.option("--auth", type=click.Choice(["both", "on", "off"]), default="both",
              show_default=True, help="DBLP rows with a job secret (MAC on every message), "
              "without, or both side by side.")
@click.option("--round-timeout", type=float, default=30.0, show_default=True,
              help="Per-round deadline; a row that misses it is reported as failed.")
@click.option("--quick", is_flag=True,
              help="Short run for tests: 1 MiB, 2 reps, losses 0 and 0.5, UDP, no gloo, "
                   "authenticated.")
def transport_cmd(json_out, reps, losses, rate_mbit, mbytes, controls, bounds, no_gloo,
                  no_sharded, auth, round_timeout, quick):
    """DBLP push+pull vs gloo all-reduce on an HTB-shaped veth pair (needs root)."""
    if os.geteuid() != 0:
        raise click.UsageError("bench transport needs root (network namespaces)")
    try:
        loss_list = tuple(float(x) for x in losses.split(","))
        bound_list = tuple(float(x) for x in bounds.split(","))
    except ValueError:
        raise click.BadParameter("--losses/--bounds must be comma-separated numbers") from None
    if any(not 0 <= x < 1 for x in loss_list):
        raise click.BadParameter("every loss must be in [0, 1)", param_hint="--losses")
    if any(not 0 <= x < 1 for x in bound_list):
        raise click.BadParameter("every bound must be in [0, 1)", param_hint="--bounds")
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
                           auth={"both": (False, True), "on": (True,), "off": (False,)}[auth])
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the namespaces are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    output.say(HEADER)
    rows: list[dict] = []
    try:
        doc = run_bench(loss_list, reps, numel, rate_mbit * 1e6, cfgs, round_timeout,
                        log=output.say, rows=rows)
    except ExperimentFailed as e:
        # Keep what was measured: the rows before the failure, and the failure itself.
        if json_out:
            partial = bench_doc(loss_list, reps, numel, rate_mbit * 1e6, rows)
            results({**partial, "failed": str(e)}, json_out, lambda: None)
        raise
    results(doc, json_out, lambda: click.echo(format_table(doc)))


if __name__ == "__main__":
    agent_main(sys.argv[1:])
