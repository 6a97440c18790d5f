"""The two processes of a `bench transport` row, one per namespace, and the driver's handle on each.

An agent runs inside a namespace (``python -m testbed.bench.agents ARGS``),
builds its side of a DBLP job or a gloo group, and answers one JSON line per
command line on stdin ("prepare", "go", "quit"); ``Agent`` starts one through
``ip netns exec`` and reads its replies with a deadline.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from testbed import REPO_ROOT
from testbed.emulation.netns import NetnsPair


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

    serve_commands(prepare, collective)
    obj.close()


def serve_commands(prepare, collective) -> None:
    """Say ready, then answer "prepare" and "go" command lines until "quit" or a failure.

    "prepare" makes the round's copy of the gradient (the command's other fields,
    where the driver sends any, are ``prepare``'s keywords: `bench collectives`
    names its collective and size there); "go" runs the collective and
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
                prepare(**{k: v for k, v in cmd.items() if k != "cmd"})
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

    serve_commands(prepare, collective)
    os._exit(0)  # a gloo group after a timeout can hang in its destructor


def agent_main(argv: list[str]) -> None:
    args = json.loads(argv[0])
    if args["kind"] == "gloo":
        _agent_gloo(args)
    else:
        _agent_dblp(args)


class Agent:
    """A process in a namespace that answers one JSON line per command."""

    def __init__(self, pair: NetnsPair, side: int, args: dict, secret: str | None = None,
                 module: str = "testbed.bench.agents"):
        # ``module``: whose agent runs (``python -m MODULE ARGS``), this module's by default
        self.side = side  # 0: namespace a (worker / rank 0), 1: namespace b (aggregator / rank 1)
        root = str(REPO_ROOT)
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("DBLP_SECRET", None)
        if secret is not None:
            env["DBLP_SECRET"] = secret
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", pair.ns[side], sys.executable, "-m",
             module, json.dumps(args)],
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



if __name__ == "__main__":
    agent_main(sys.argv[1:])
