"""`dblp-testbed bench flood`: honest rounds with and without an unauthenticated flood.

A parameter-server job on loopback (an aggregator and two members, each a
process of its own, one job secret) runs rounds back to back. Between blocks
of rounds the driver starts and stops a flood: one Python process sending
forged DATA (the job's session, a member's rank, the job's round numbers: all
a sniffer sees) with tags it cannot make, as fast as it can, to the
aggregator's port. One process is the highest rate an attacker gets without
spending more CPU than the job; on a 2-core machine it also takes CPU from
the job, which is part of what the bench measures.

A control block floods a socket the driver holds open and never reads,
on the same machine, at the same rate: its rounds pay for the flooder's CPU
(and the kernel's work of dropping its datagrams) but not for anything the
job's aggregator does about them, so flooded / control separates what the
aggregator spends from what one more busy process costs two cores.

Rounds are told apart by time, not by count: every member round and the
flood's first and last send carry ``time.monotonic()`` stamps (one clock for
every process of the machine), a round wholly inside a flood is a flood
round, one that overlaps none is a quiet round, and one a switch falls in is
neither. Blocks go quiet, flood, quiet, control, ..., so every kind meets the
same machine. The answer: each kind's median round, flooded / quiet (issue
bound: at most 2x) and control / quiet,
the flood's datagrams per second, what the aggregator counted, and whether
every round's aggregate was exact.

A flood comes from one source, or from ``--sources N`` rotating ones (each
datagram from the next of N loopback addresses, 127.1.0.0 on: the kernel
lets a socket send from any local address through ``IP_PKTINFO``, so N
sources cost one socket), and carries the job's session or, with
``--sessions foreign``, sessions the job never had (one per datagram of
the flood's cycle): the two floods that cost an aggregator most before it
dropped what no one authenticated before any MAC or key derivation.

The processes are this module run with a role (`python -m testbed.bench.flood
server|member|flood ...`); the secret travels in ``DBLP_SECRET``, never on a
command line.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time

import click

from testbed import output
from testbed.errors import ExperimentFailed
from testbed.output import json_option, results

SCHEMA = 4  # 2: control blocks (a flood of a sink, not the job); 3: sources and sessions;
#            4: the aggregator's foreign drops and CPU samples, cpu_per_forged_us
#: Where rotating sources start: 127.1.0.0, 127.1.0.1, ... (all of 127/8 is this machine's).
SOURCES_BASE = (127 << 24) | (1 << 16)
SESSIONS = ("job", "foreign")
#: Linux's IP_PKTINFO (in.h), which Python's socket module does not export.
IP_PKTINFO = getattr(__import__("socket"), "IP_PKTINFO", 8)
N_MEMBERS = 2
DEFAULT_NUMEL = 1 << 20  # 4 MiB of float32, as `bench transport`
#: Forged datagrams the flood cycles through: 16 chunks of every round of the job.
FORGED_PER_ROUND = 16


def _role_server(port: int, rounds: int, session: int) -> None:
    import dblp

    srv = dblp.ParameterServer("127.0.0.1", port, N_MEMBERS, "reliable",
                               secret=os.environ["DBLP_SECRET"], session_id=session,
                               round_timeout=30)
    print(json.dumps({"port": srv.port}), flush=True)  # bound: the driver's cue
    # (monotonic time, this process's CPU time) at every round's end: the CPU the
    # aggregator spent while flooded against while quiet (`cpu_per_forged`).
    cpu = [(time.monotonic(), time.process_time())]
    try:
        srv.serve(rounds, on_round_end=lambda r, st: cpu.append((time.monotonic(),
                                                                 time.process_time())))
        from dblp import sockfilter

        c = srv.engine.counters
        print(json.dumps({"unauthenticated": c.unauthenticated, "foreign": c.foreign,
                          "socket_drops": sockfilter.socket_drops(srv.engine.sock),
                          "blocked_sources": len(srv.engine.bad.blocked), "cpu": cpu}),
              flush=True)
    finally:
        srv.close()


def _role_member(rank: int, port: int, rounds: int, numel: int, session: int) -> None:
    import numpy as np

    import dblp

    expected = (1 + N_MEMBERS) / 2  # the mean of 1, 2, ... N_MEMBERS
    with dblp.TransportGroup(rank, N_MEMBERS, "127.0.0.1", port, policy="reliable",
                             secret=os.environ["DBLP_SECRET"], session_id=session,
                             round_timeout=30) as g:
        for r in range(rounds):
            t = np.full(numel, float(rank + 1), np.float32)
            t0 = time.monotonic()
            g.allreduce_(t)
            t1 = time.monotonic()
            print(json.dumps({"round": r, "t0": t0, "t1": t1,
                              "exact": bool(np.all(t == expected))}), flush=True)


def _role_flood(port: int, session: int, rounds: int, sources: int = 1,
                foreign: int = 0) -> None:
    import random
    import socket
    import struct

    from dblp import wire

    pay = bytes(wire.CHUNK_BYTES)
    rng = random.Random()
    msgs = [wire.pack_header(wire.MsgType.DATA, src=0,
                             session=(rng.getrandbits(63) | 1) if foreign else session,
                             round=r, index=i, count=FORGED_PER_ROUND * 10, length=len(pay),
                             aux=1, seq=i)
            + pay + os.urandom(wire.TAG_SIZE)
            for r in range(rounds) for i in range(FORGED_PER_ROUND)]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    if sources == 1:
        s.bind(("127.0.0.1", 0))
        s.connect(("127.0.0.1", port))  # send() without an address: about 1.2x sendto's rate
        send = s.send
    else:
        # One socket, each datagram from the next source address (IP_PKTINFO's ipi_spec_dst).
        s.bind(("0.0.0.0", 0))
        anc = [[(socket.IPPROTO_IP, IP_PKTINFO,
                 struct.pack("=I4s4s", 0, struct.pack("!I", SOURCES_BASE + k), bytes(4)))]
               for k in range(sources)]
        dst = ("127.0.0.1", port)
        turn = [0]

        def send(m):
            k = turn[0]
            turn[0] = (k + 1) % sources
            return s.sendmsg([m], anc[k], 0, dst)
    print(json.dumps({"armed": True, "port": s.getsockname()[1]}), flush=True)
    sys.stdin.readline()  # armed (imports and messages made) until the driver says go
    n, first = 0, time.monotonic()
    print(json.dumps({"t0": first}), flush=True)
    while not stop:
        for m in msgs:
            try:
                send(m)
            except OSError:
                pass  # ECONNREFUSED from an ICMP error to an earlier datagram, ENOBUFS
        n += len(msgs)
    print(json.dumps({"t0": first, "t1": time.monotonic(), "sent": n}), flush=True)


def _spawn(role: str, *args, env: dict, stdout=subprocess.PIPE, stdin=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed.bench.flood", role,
                             *(str(a) for a in args)], stdout=stdout, stdin=stdin, text=True,
                            env=env)


def armed_flood(port: int, session: int, rounds: int, env: dict, sources: int = 1,
                foreign: bool = False) -> tuple[subprocess.Popen, int]:
    """A flood process towards ``port`` with its imports done and its datagrams made,
    waiting for `go`, and the UDP port it sends from: started ahead, so a flood block
    begins within a millisecond of the driver's word, not after a Python start-up longer
    than a block of small rounds. `stop` ends it."""
    return _spawn_with_port("flood", [port, session, rounds, sources, int(foreign)], env,
                            "the flood process exited ({code}) before it was armed",
                            stdin=subprocess.PIPE)


def started_server(rounds: int, session: int, env: dict) -> tuple[subprocess.Popen, int]:
    """The aggregator's process and the port it bound. It binds port 0 and says which:
    a port chosen free beforehand can be taken before the server binds it (by a flood
    process's own socket, or by anything else on the machine), and the job then waits
    for an aggregator that never came."""
    return _spawn_with_port("server", [0, rounds, session], env,
                            "the aggregator exited ({code}) before binding its port; "
                            "its error is above")


def _spawn_with_port(role: str, args: list, env: dict, gone: str,
                     stdin=None) -> tuple[subprocess.Popen, int]:
    """A role's process and the port its first line names; ``gone`` says why there is none."""
    proc = _spawn(role, *args, env=env, stdin=stdin)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise ExperimentFailed("bench flood: " + gone.format(code=proc.wait()))
    return proc, int(json.loads(line)["port"])


def classify(rounds: list[dict], floods: list[dict]) -> list[str]:
    """Each round's kind: "flood" or "control" (wholly inside a flood of the job or of the
    sink: a flood's ``target``, "job" if it has none), "quiet" (overlapping none) or
    "switch" (a flood began or ended in it)."""
    kinds = []
    for r in rounds:
        inside = [f for f in floods if f["t0"] <= r["t0"] and r["t1"] <= f["t1"]]
        overlap = any(r["t0"] < f["t1"] and f["t0"] < r["t1"] for f in floods)
        kinds.append(("control" if inside[0].get("target") == "sink" else "flood") if inside
                     else "switch" if overlap else "quiet")
    return kinds


def block_plan(blocks: int) -> list[str]:
    """The blocks' kinds: quiet, flood, quiet, control, ... (every other block quiet)."""
    return ["quiet" if b % 2 == 0 else ("flood", "control")[(b // 2) % 2] for b in range(blocks)]


def run_flood_bench(blocks: int = 8, block_rounds: int = 8, numel: int = DEFAULT_NUMEL,
                    log=print, sources: int = 1, sessions: str = "job") -> dict:
    """``blocks`` blocks of ``block_rounds`` rounds each, quiet, flooded and control in turn
    (`block_plan`, after two warm-up rounds); the bench's document.

    A block counts only rounds that began after it did: a flood block from the
    flood's first send, a quiet block from its last. The members run a few
    rounds more than the blocks need (a switch round belongs to neither), and
    the driver stops switching when the blocks are done.
    """
    import socket

    plan = block_plan(blocks)
    total = 2 + blocks * (block_rounds + 2)
    session = secrets.randbits(63) | 1
    env = {**os.environ, "DBLP_SECRET": secrets.token_hex(32)}
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # the control's target: never read
    sink.bind(("127.0.0.1", 0))
    label = {"flood": "job", "control": "sink"}  # a flood's ``target`` in the document
    armed: list[subprocess.Popen] = []
    procs: list[subprocess.Popen] = []
    rounds: list[dict] = []
    floods: list[dict] = []
    flood = None
    block, need, counted, since = -1, 2, 0, 0.0  # block -1: the warm-up
    try:
        server, port = started_server(total, session, env)
        procs.append(server)
        target = {"flood": port, "control": sink.getsockname()[1]}
        # Every flood process armed before the first round: one started during a block
        # would take CPU from that block's rounds for its whole start-up (~0.3 s, a block).
        for k in plan:
            if k != "quiet":
                armed.append(armed_flood(target[k], session, total, env, sources,
                                         sessions == "foreign")[0])
        procs += [_spawn("member", w, port, total, numel, session, env=env,
                         stdout=subprocess.PIPE if w == 0 else subprocess.DEVNULL)
                  for w in range(N_MEMBERS)]
        member = procs[1]
        assert member.stdout is not None
        for line in member.stdout:
            rec = json.loads(line)
            rounds.append(rec)
            counted += rec["t0"] >= since
            if counted < need or block >= len(plan):
                continue
            if flood is not None:
                floods.append({**stop(flood), "target": label[plan[block]]})
                flood, since = None, floods[-1]["t1"]
                log(f"bench flood: {plan[block]} off after round {rec['round']}")
            block += 1
            counted, need = 0, block_rounds
            if block == len(plan):
                continue
            if plan[block] != "quiet":
                flood = armed.pop(0)
                since = go(flood)
                log(f"bench flood: {plan[block]} on after round {rec['round']}")
            else:
                since = max(since, rec["t1"])
        if flood is not None:
            floods.append({**stop(flood), "target": label[plan[-1]]})
            flood = None
        if procs[1].wait(timeout=60) != 0 or len(rounds) < total:
            raise ExperimentFailed(f"bench flood: member 0 stopped after {len(rounds)} of "
                                   f"{total} rounds (exit {procs[1].returncode})")
        server_out = procs[0].communicate(timeout=60)[0]
        counters = json.loads(server_out.strip().splitlines()[-1]) if server_out.strip() else {}
    finally:
        sink.close()
        for f in [flood, *armed]:
            if f is not None and f.poll() is None:
                f.kill()
                f.wait()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    doc = flood_doc(rounds[2:], floods, numel, counters)
    return {**doc, "sources": sources, "sessions": sessions}


def go(proc: subprocess.Popen) -> float:
    """Start an armed flood; the time of its first send."""
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise ExperimentFailed(f"bench flood: the flood process exited ({proc.wait()}) "
                               "before sending")
    return float(json.loads(line)["t0"])


def stop(proc: subprocess.Popen) -> dict:
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=30)[0]
    return json.loads(out.strip().splitlines()[-1])


def flood_doc(rounds: list[dict], floods: list[dict], numel: int, counters: dict) -> dict:
    """The self-describing result: every round with its kind, and the medians and ratios."""
    kinds = classify(rounds, floods)
    secs = {k: [r["t1"] - r["t0"] for r, kk in zip(rounds, kinds, strict=True) if kk == k]
            for k in ("quiet", "flood", "control")}
    med = {k: statistics.median(v) if v else None for k, v in secs.items()}

    def over_quiet(k):
        return med[k] / med["quiet"] if med["quiet"] and med[k] else None

    def rate(target):
        r = [f["sent"] / (f["t1"] - f["t0"]) for f in floods
             if f.get("target", "job") == target and f["t1"] > f["t0"]]
        return statistics.median(r) if r else None
    return {"schema": SCHEMA, "kind": "bench-flood", "members": N_MEMBERS, "numel": numel,
            "quiet_s": med["quiet"], "flood_s": med["flood"], "control_s": med["control"],
            "ratio": over_quiet("flood"), "control_ratio": over_quiet("control"),
            "quiet_rounds": len(secs["quiet"]), "flood_rounds": len(secs["flood"]),
            "control_rounds": len(secs["control"]),
            "flood_datagrams_per_s": rate("job"), "control_datagrams_per_s": rate("sink"),
            "all_exact": all(r["exact"] for r in rounds), "aggregator": counters,
            "cpu_per_forged_us": cpu_per_forged(rounds, kinds, floods, counters.get("cpu")),
            "rounds": [{**r, "kind": k} for r, k in zip(rounds, kinds, strict=True)],
            "floods": floods}


def cpu_per_forged(rounds: list[dict], kinds: list[str], floods: list[dict],
                   cpu: list | None) -> float | None:
    """The aggregator's CPU time per forged datagram sent at it (microseconds): its CPU
    over the job's flood blocks, less what the same time costs it quiet (its CPU rate
    over the quiet rounds), over the datagrams the floods sent. None without samples."""
    if not cpu or len(cpu) < 2:
        return None
    ts, cs = zip(*cpu, strict=True)

    def used(a: float, b: float) -> float:
        import numpy as np
        return float(np.interp(b, ts, cs) - np.interp(a, ts, cs))
    quiet = [r for r, k in zip(rounds, kinds, strict=True) if k == "quiet"]
    quiet_s = sum(r["t1"] - r["t0"] for r in quiet)
    jobs = [f for f in floods if f.get("target", "job") == "job" and f["t1"] > f["t0"]]
    sent = sum(f["sent"] for f in jobs)
    if not quiet_s or not sent:
        return None
    rate = sum(used(r["t0"], r["t1"]) for r in quiet) / quiet_s
    extra = sum(used(f["t0"], f["t1"]) - rate * (f["t1"] - f["t0"]) for f in jobs)
    return round(1e6 * extra / sent, 3)


def format_doc(doc: dict) -> str:
    def ms(x):
        return "–" if x is None else f"{1e3 * x:.1f} ms"
    def x(r):
        return "–" if r is None else f"{r:.2f}x"

    def per_s(r):
        return "–" if r is None else f"{r:,.0f}"

    def us(v):
        return "–" if v is None else f"{v:.2f} us"
    agg = doc["aggregator"]
    return (f"quiet rounds: {doc['quiet_rounds']}, median {ms(doc['quiet_s'])}\n"
            f"flood rounds: {doc['flood_rounds']}, median {ms(doc['flood_s'])}\n"
            f"control rounds (a sink flooded): {doc['control_rounds']}, "
            f"median {ms(doc.get('control_s'))}\n"
            f"flood / quiet: {x(doc['ratio'])} (bound: 2x); "
            f"control / quiet: {x(doc.get('control_ratio'))}\n"
            f"flood rate: {per_s(doc['flood_datagrams_per_s'])} datagrams/s from one process, "
            f"{doc.get('sources', 1):,} source address(es), {doc.get('sessions', 'job')} "
            f"sessions (control: {per_s(doc.get('control_datagrams_per_s'))})\n"
            f"aggregator: {agg.get('unauthenticated', '–')} datagrams dropped for their tags, "
            f"{agg.get('foreign', '–')} before any tag (another session, not a member's "
            f"address), {agg.get('socket_drops', '–')} by its socket (its filter, or a full "
            f"buffer); every aggregate exact: {'yes' if doc['all_exact'] else 'NO'}\n"
            f"aggregator CPU per forged datagram sent: "
            f"{us(doc.get('cpu_per_forged_us'))}")


@click.command("flood")
@json_option
@click.option("--blocks", type=int, default=8, show_default=True,
              help="Blocks of rounds: quiet, flooded, quiet, control, ... in turn.")
@click.option("--block-rounds", type=int, default=8, show_default=True, help="Rounds per block.")
@click.option("--mbytes", type=float, default=4.0, show_default=True, help="Gradient size (MiB).")
@click.option("--sources", type=click.IntRange(1, 65_536), default=1, show_default=True,
              help="Source addresses the flood rotates through (127.1.0.0 on), one per datagram.")
@click.option("--sessions", type=click.Choice(SESSIONS), default="job", show_default=True,
              help="job: the forged datagrams carry the job's session; foreign: sessions the "
                   "job never had.")
def flood_cmd(json_out, blocks, block_rounds, mbytes, sources, sessions):
    """Honest PS rounds on loopback with and without a flood of forged DATA from one process."""
    if blocks < 2:
        raise click.BadParameter("must be >= 2 (a quiet block and a flooded one)",
                                 param_hint="--blocks")
    if block_rounds < 3:
        raise click.BadParameter("must be >= 3 (a block's first round is a switch)",
                                 param_hint="--block-rounds")
    if not mbytes > 0:
        raise click.BadParameter("must be positive", param_hint="--mbytes")
    doc = run_flood_bench(blocks, block_rounds, int(mbytes * (1 << 20)) // 4, log=output.say,
                          sources=sources, sessions=sessions)
    results(doc, json_out, lambda: click.echo(format_doc(doc)))
    if not doc["all_exact"]:
        raise ExperimentFailed("bench flood: an aggregate was not the exact mean")


def main(argv: list[str]) -> None:
    role, args = argv[0], [int(a) for a in argv[1:]]
    {"server": _role_server, "member": _role_member, "flood": _role_flood}[role](*args)


if __name__ == "__main__":
    main(sys.argv[1:])
