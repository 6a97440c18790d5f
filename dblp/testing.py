"""Run a whole DBLP job (server + members) on loopback in threads: for tests and demos."""
from __future__ import annotations

import random
import socket
import threading

import numpy as np

import dblp
from dblp.wire import CHUNK_BYTES


def free_port() -> int:
    """A loopback port free for UDP and for TCP at once, below the kernel's ephemeral range.

    TCP control binds the UDP port's number too: a port free for UDP alone can be a TCP
    connection's, and the bind fails. A job binds the port some time after it is chosen
    (a server process imports its libraries first, other processes start meanwhile); a
    port from the ephemeral range can in that time become any socket's automatic port
    (a member's, a flooder's, another test's), and the job waits for an aggregator that
    could not bind. Below the range only an explicit bind can take it.
    """
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12_000), low)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t, \
                    socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                t.bind(("127.0.0.1", port))
                u.bind(("127.0.0.1", port))
        except OSError:
            continue
        return port
    raise OSError(f"no loopback port below {low} free for both UDP and TCP in 200 tries")


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The lowest port the kernel hands out on its own (32768 where it cannot be read)."""
    try:
        with open(path) as f:
            return max(2048, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768


def gradients(n_workers: int, rounds: int, numel: int, seed: int = 0) -> list[list[np.ndarray]]:
    return [[np.random.default_rng([seed, w, r]).standard_normal(numel).astype(np.float32)
             for r in range(rounds)] for w in range(n_workers)]


def run_job(n_workers=3, mode="ps", policy="reliable", rounds=2, numel=20_000, control="udp",
            missing="zero", fault=0.0, round_timeout=20.0, knobs=None, grads=None,
            secret: str | None = None) -> tuple[dict, list, list]:
    """Returns (results[w][r] = (tensor, stats, last_result), server stats, gradients).

    ``secret`` (hex) authenticates the job as a launcher would; ``fault`` drops
    that fraction of what every participant receives (the bench's loss, in process).
    """
    knobs = knobs or {}
    grads = grads or gradients(n_workers, rounds, numel)
    results: dict = {}
    errors: list = []
    server_stats: list = []
    srv = None
    if mode == "ps":
        srv = dblp.ParameterServer("127.0.0.1", 0, n_workers, policy, control=control,
                                   missing=missing, round_timeout=round_timeout,
                                   fault_rx_drop=fault, secret=secret, **knobs)
        port = srv.port

        def serve():
            try:
                server_stats.extend(srv.serve(rounds))
            except Exception as exc:  # surfaced by the test
                errors.append(exc)
        threads = [threading.Thread(target=serve)]
    else:
        port = free_port()
        threads = []

    def work(w):
        try:
            with dblp.TransportGroup(w, n_workers, "127.0.0.1", port, mode=mode, policy=policy,
                                     control=control, missing=missing, round_timeout=round_timeout,
                                     fault_rx_drop=fault, secret=secret, **knobs) as g:
                out = []
                for r in range(rounds):
                    t = grads[w][r].copy()
                    st = g.allreduce_(t)
                    out.append((t, st, g.last_result))
                results[w] = out
        except Exception as exc:
            errors.append(exc)
    threads += [threading.Thread(target=work, args=(w,)) for w in range(n_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if srv is not None:
        srv.close()
    if errors:
        raise errors[0]
    return results, server_stats, grads


def dropped_mask(last_result, parts) -> np.ndarray:
    """Elements every replica zero-filled in the pull (the FINAL set U)."""
    numel = parts[-1].stop
    mask = np.zeros(numel, bool)
    sets = [(r.part, r.final) for r in last_result.pull_receivers]
    sets += [(g.part.index, g.dropped) for g in last_result.pull_groups]
    for idx, dropped in sets:
        p = parts[idx]
        mask[p.start:p.stop] = p.expand(dropped)
    return mask


def expected_aggregate(grads, results, r, n_workers, mode="ps", missing="zero",
                       chunk_bytes: int = CHUNK_BYTES):
    """The aggregate the protocol promises, rebuilt from the STOP bitmaps.

    Every chunk the aggregator held from a member counts; missing chunks are
    zero (divide by N) or skipped (divide by deliverers, ``missing="mean"``);
    chunks in the pull's dropped set U are zero on every replica.
    ``chunk_bytes``: the job's (``TransportConfig.chunk_bytes``).
    """
    from dblp.rounds import make_layout
    numel = grads[0][r].size
    parts = make_layout(numel, mode, n_workers, chunk_bytes=chunk_bytes)
    total = np.zeros(numel, np.float64)
    count = np.zeros(numel, np.float64)
    for w in range(n_workers):
        held = np.ones(numel, bool)
        for s in results[w][r][2].push_senders:
            p = parts[s.part]
            held[p.start:p.stop] = p.expand(s.held)
        total += np.where(held, grads[w][r], 0)
        count += held
    agg = total / (np.maximum(count, 1) if missing == "mean" else n_workers)
    agg[count == 0] = 0
    agg[dropped_mask(results[0][r][2], parts)] = 0
    return agg.astype(np.float32)


def collect_agents(procs, timeout: float = 120) -> list:
    """The last JSON line of each agent subprocess, asserting it exited cleanly.

    Used by the namespace tests, which run one agent per namespace.
    """
    import json
    import subprocess
    outs = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        assert p.returncode == 0, e[-2000:]
        outs.append(json.loads(o.strip().splitlines()[-1]))
    return outs
