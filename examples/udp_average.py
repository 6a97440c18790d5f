"""A small transport written for the testbed's command arms: gradient averaging over UDP.

Each worker sends its gradient to a server in datagrams; the server averages
what arrived by a deadline and sends the average back. Nothing is
retransmitted: a chunk no worker delivered averages to zero, and a chunk of
the average a worker never got is its own gradient's. Training uses the
project's own models and data (``workloads.models``, ``workloads.tasks``),
so the arm is compared with the built-in ones on equal terms.

The harness runs it as ``python examples/udp_average.py worker`` on every
worker's host and ``... server`` on the server's (examples/udp_average.toml),
with the contract of docs/commands.md: it reads its settings from the
environment the harness sets and writes one JSON line per round start, round
end and evaluation to ``$TESTBED_LOG``, through the contract's own writer
(``testbed.run.commandlog``), which stamps the lines, times the exchange and
checks every line as it is written.
"""
from __future__ import annotations

import math
import os
import socket
import struct
import sys
import time

import numpy as np
import torch

from testbed.run.commandlog import CommandLogWriter
from workloads.models import build_model, get_spec, make_optimizer
from workloads.tasks import make_task

HEAD = struct.Struct("!8sIHI")   # unit tag, round, sender (SERVER: the server), chunk index
FLOATS = 350                     # float32s per datagram: 1,400 bytes, never IP-fragmented
SERVER = 0xFFFF
JOIN = 0xFFFFFFFF                # the round of the hello every worker sends before round 0
WIRE_BITS = (HEAD.size + 4 * FLOATS + 28) * 8   # one datagram with its UDP and IP headers
ENV = os.environ
# The unit's secret tags every datagram, so a late one of an earlier unit is dropped.
TAG = bytes.fromhex(ENV["TESTBED_SECRET"])[:8]
RATE = float(ENV["TESTBED_RATE_BPS"])
WORLD, ROUNDS = int(ENV["WORLD_SIZE"]), int(ENV["TESTBED_ROUNDS"])
MODEL, SEED = ENV["TESTBED_MODEL"], int(ENV["TESTBED_SEED"])


def send(sock, rnd: int, sender: int, vec: np.ndarray, dests: list) -> int:
    """Every chunk of ``vec`` to every destination, paced at $TESTBED_RATE_BPS; bytes sent."""
    t0, bits = time.perf_counter(), 0
    for i in range(0, len(vec), FLOATS):
        for dest in dests:
            sock.sendto(HEAD.pack(TAG, rnd, sender, i // FLOATS) + vec[i:i + FLOATS].tobytes(), dest)
            bits += WIRE_BITS
            ahead = t0 + bits / RATE - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
    return bits // 8


def receive(sock, rnd: int, n: int, deadline: float, take) -> int:
    """``take(sender, index, floats, addr)`` for datagrams of round ``rnd`` until ``n`` arrived
    or the deadline passed (math.inf: wait for ever); how many arrived."""
    got = 0
    while got < n:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        sock.settimeout(None if math.isinf(left) else left)
        try:
            data, addr = sock.recvfrom(65535)
        except TimeoutError:
            break
        tag, r, sender, index = HEAD.unpack_from(data)
        if tag == TAG and r == rnd:
            take(sender, index, np.frombuffer(data, np.float32, offset=HEAD.size), addr)
            got += 1
    return got


def push_s(n_floats: int) -> float:
    """Seconds one worker's push takes at its fair share (the server's rate over the workers)."""
    per_worker = RATE if ENV["TESTBED_ROLE"] == "worker" else RATE / WORLD
    return math.ceil(n_floats / FLOATS) * WIRE_BITS / per_worker


def server() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)   # bound first: workers may be quick
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(("0.0.0.0", int(ENV["MASTER_PORT"])))
    size = sum(p.numel() for p in build_model(MODEL, SEED).parameters() if p.requires_grad)
    chunks = math.ceil(size / FLOATS)
    deadline_s = 2 * push_s(size) + 0.25      # after a round's first datagram
    workers: dict[int, tuple] = {}
    while len(workers) < WORLD:               # every worker's hello, then "go" to each
        receive(sock, JOIN, 1, math.inf, lambda sender, i, f, addr: workers.update({sender: addr}))
    send(sock, JOIN, SERVER, np.zeros(1, np.float32), list(workers.values()))
    total, count = np.zeros(size, np.float32), np.zeros(chunks)
    seen = np.zeros((WORLD, chunks), bool)

    def add(sender, index, floats, addr):
        workers[sender] = addr
        if sender < WORLD and not seen[sender, index]:
            seen[sender, index] = True
            total[index * FLOATS:index * FLOATS + len(floats)] += floats
            count[index] += 1
    for rnd in range(ROUNDS):
        total[:], count[:], seen[:] = 0, 0, False
        receive(sock, rnd, 1, math.inf, add)  # the round starts with its first datagram
        receive(sock, rnd, WORLD * chunks - 1, time.perf_counter() + deadline_s, add)
        average = total / np.repeat(np.maximum(count, 1), FLOATS)[:size].astype(np.float32)
        send(sock, rnd, SERVER, average, list(workers.values()))


def worker() -> None:
    rank = int(ENV["RANK"])
    log = CommandLogWriter()                  # $TESTBED_LOG, the contract's lines
    spec = get_spec(MODEL)
    torch.manual_seed(SEED + 1000 * rank)
    model = build_model(MODEL, SEED)
    opt = make_optimizer(spec, model.parameters(), float(ENV["TESTBED_LR"]) or None)
    task = make_task(spec, rank, WORLD, int(ENV["TESTBED_BATCH_SIZE"]) or spec.batch_size, SEED)
    params = [p for p in model.parameters() if p.requires_grad]
    size = sum(p.numel() for p in params)
    wait_s = 3 * push_s(size) + 1.0           # after the push: the server's deadline and reply
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    server = (ENV["MASTER_ADDR"], int(ENV["MASTER_PORT"]))
    every = int(ENV["TESTBED_EVAL_EVERY"])
    average = np.zeros(size, np.float32)

    def put(sender, index, floats, addr):
        average[index * FLOATS:index * FLOATS + len(floats)] = floats
    while True:   # hello until the server says go: every worker starts round 0 together
        send(sock, JOIN, rank, np.zeros(1, np.float32), [server])
        if receive(sock, JOIN, 1, time.perf_counter() + 0.5, lambda *a: None):
            break
    log.start(params=size, grad_bytes=4 * size)
    for rnd in range(ROUNDS):
        log.round_start(rnd)
        x, y = task.batches.batch(rnd)
        opt.zero_grad(set_to_none=False)
        loss = task.loss_fn(model(x), y)
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
        with log.exchange():                  # comm_s and the CPU split: the time in here
            sent = send(sock, rnd, rank, grad, [server])
            average[:] = grad                 # a chunk that never comes back stays our own
            got = receive(sock, rnd, math.ceil(size / FLOATS), time.perf_counter() + wait_s, put)
        off = 0
        for p in params:
            p.grad.copy_(torch.from_numpy(average[off:off + p.numel()]).view_as(p))
            off += p.numel()
        opt.step()
        log.round_end(loss=loss.item(), epoch=task.batches.epoch_of(rnd),
                      stats={"bytes_sent": sent, "dropped": math.ceil(size / FLOATS) - got})
        if rank == 0 and ((rnd + 1) % every == 0 or rnd == ROUNDS - 1):   # replicas agree
            acc, test_loss = task.evaluate(model)
            log.eval(rnd, test_accuracy=acc, test_loss=test_loss)
    log.close()


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"worker": worker, "server": server}[sys.argv[1]]()
