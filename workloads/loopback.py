"""Run arms on loopback (127.0.0.1, distinct ports): the same entry points, without Mininet.

``python -m workloads.loopback --arms gloo,reliable,static,dblp,local --out DIR``
starts, per arm, the aggregation server (dblp arms only) and N workers as
separate processes with torchrun-style variables, waits for them, and
summarises accuracy and time per arm. As the harness's launcher does, it
writes each unit's settings into its directory, ``training.json`` (and
``transport.json`` for a dblp arm), and every process reads them there. Logs
follow the run-directory layout (``DIR/raw/<arm>/seed-<seed>/worker<rank>.jsonl``,
``server.jsonl``), so it doubles as a smoke test of what the orchestrator
launches on emulated hosts.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from dblp.testing import free_port

from .exchange import transports, uses_dblp
from .models import MODELS
from .runlog import unit_dir
from .training import DEFAULT_MODEL, TRAINING_FILE, TrainingSettings


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def write_transport_config(arm: str, directory: str, **settings) -> str:
    """The arm's ``transport.json`` with a fresh per-job secret and session; returns its path.

    This is what a launcher does: whoever starts the job makes its key, and
    every process of the job reads the same file.
    """
    import secrets

    from dblp import CONFIG_FILE, TransportConfig
    settings.setdefault("secret", secrets.token_hex(32))
    settings.setdefault("session_id", secrets.randbits(63) | 1)
    path = os.path.join(directory, CONFIG_FILE)
    TransportConfig(policy=arm, **settings).write(path)
    return path


def write_training_settings(directory: str, **settings) -> str:
    """The unit's ``training.json`` (`TrainingSettings`); returns its path.

    Written once, read by the server and every worker, as the harness's
    launcher writes it.
    """
    path = os.path.join(directory, TRAINING_FILE)
    TrainingSettings(**settings).write(path)
    return path


def run_arm(arm: str, out: str, workers: int = 3, rounds: int = 300, model: str = DEFAULT_MODEL,
            seed: int = 0, worker_args: list[str] | None = None, server_args: list[str] | None = None,
            timeout_s: float = 600.0, python: str = sys.executable,
            transport: dict | None = None, training: dict | None = None) -> dict:
    """Train one arm on loopback; returns its summary (status, accuracy, times, exit codes).

    ``training``: further settings of the unit's `TrainingSettings` (e.g.
    ``{"eval_every": 4}``) beside ``rounds``, ``model`` and ``seed``, written
    to ``raw/<arm>/seed-<seed>/training.json``. ``transport``: settings of
    the dblp arms' ``TransportConfig`` (e.g. ``{"round_timeout": 20.0}``),
    written to ``raw/<arm>/seed-<seed>/transport.json``; with
    ``{"mode": "sharded"}`` no server starts (every worker aggregates a shard).
    ``worker_args``, ``server_args``: further flags of the processes (a
    training setting is not one: it is in the file).
    """
    if arm not in transports():
        raise ValueError(f"unknown arm {arm!r}; choose from {transports()}")
    raw = unit_dir(os.path.join(out, "raw"), arm, seed)
    os.makedirs(raw, exist_ok=True)
    port = free_port()
    base_env = dict(os.environ, WORLD_SIZE=str(workers), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
    common = ["--arm", arm, "--training-config",
              write_training_settings(raw, rounds=rounds, model=model, seed=seed, **(training or {}))]
    if uses_dblp(arm):
        common += ["--transport-config", write_transport_config(arm, raw, **(transport or {}))]
    procs, names, errs = [], [], []
    t0 = time.perf_counter()
    try:
        if uses_dblp(arm) and (transport or {}).get("mode") != "sharded":
            cmd = [python, "-m", "workloads.server", *common, "--host", "127.0.0.1",
                   "--log", os.path.join(raw, "server.jsonl"), *(server_args or [])]
            errs.append(open(os.path.join(raw, "server.err"), "w"))
            procs.append(subprocess.Popen(cmd, env=base_env, stderr=errs[-1]))
            names.append("server")
        for rank in range(workers):
            env = dict(base_env, RANK=str(rank))
            cmd = [python, "-m", "workloads.worker", *common,
                   "--log", os.path.join(raw, f"worker{rank}.jsonl"), *(worker_args or [])]
            errs.append(open(os.path.join(raw, f"worker{rank}.err"), "w"))
            procs.append(subprocess.Popen(cmd, env=env, stderr=errs[-1]))
            names.append(f"worker{rank}")
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        _stop(procs)
        for fh in errs:
            fh.close()
    wall = time.perf_counter() - t0
    codes = {n: p.returncode for n, p in zip(names, procs, strict=True)}
    return summarize_arm(arm, raw, codes, wall)


def summarize_arm(arm: str, raw: str, codes: dict, wall_s: float) -> dict:
    w0 = read_jsonl(os.path.join(raw, "worker0.jsonl"))
    ends = [r for r in w0 if r["event"] == "end"]
    evals = [r for r in w0 if r["event"] == "eval"]
    rounds = [r for r in w0 if r["event"] == "round"]
    comm = [r["comm_s"] for r in rounds]
    rt = [(r["t_end_ns"] - r["t_start_ns"]) / 1e6 for r in rounds]
    return {
        "arm": arm,
        "status": "ok" if codes and all(c == 0 for c in codes.values()) else "error",
        "exit_codes": codes,
        "rounds": len(rounds),
        "final_accuracy": evals[-1]["test_accuracy"] if evals else None,
        "final_loss": evals[-1]["test_loss"] if evals else None,
        "train_time_s": ends[-1]["train_time_s"] if ends else None,
        "wall_s": wall_s,
        "round_ms_p50": statistics.median(rt) if rt else None,
        "comm_ms_p50": 1000 * statistics.median(comm) if comm else None,
        "error": ends[-1].get("error") if ends else "no end line",
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workloads.loopback", description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="gloo,reliable,static,dblp,local")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True,
                    help="output directory (raw/<arm>/seed-<seed>/... and loopback.json)")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    a = ap.parse_args(argv)
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    bad = [x for x in arms if x not in transports()]
    if bad:
        raise SystemExit(f"--arms: unknown {bad}; choose from {list(transports())}")
    results = []
    for arm in arms:
        res = run_arm(arm, a.out, a.workers, a.rounds, a.model, a.seed, timeout_s=a.timeout_s)
        results.append(res)
        acc = "n/a" if res["final_accuracy"] is None else f"{100 * res['final_accuracy']:.2f} %"
        tt = "n/a" if res["train_time_s"] is None else f"{res['train_time_s']:.2f} s"
        print(f"{arm:9s} {res['status']:5s} accuracy {acc:>8s}  train {tt:>8s}  "
              f"round p50 {res['round_ms_p50'] or 0:.2f} ms  comm p50 {res['comm_ms_p50'] or 0:.2f} ms"
              + (f"  error: {res['error']}" if res["status"] != "ok" else ""), flush=True)
    with open(os.path.join(a.out, "loopback.json"), "w") as fh:
        json.dump({"workers": a.workers, "rounds": a.rounds, "model": a.model, "seed": a.seed,
                   "arms": results}, fh, indent=2)
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
