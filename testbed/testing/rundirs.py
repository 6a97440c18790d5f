"""A run directory whose every answer is known in advance, for tests of the analysis.

`make_run` writes a run directory (RUN/raw/ in the declared raw-log events of
`workloads.runlog`, spec.toml and manifest.json) with chosen
timings: three workers whose compute ends staggered (so only the
critical-path definition of latency gives the chosen numbers), two bursts per
arm of which the second touches the previous round's end exactly (so the
timestamp join must be strict), and per-arm end/eval events. With several
seeds, every arm repeats in raw/<arm>/seed-<seed>/ later on the clock, each
seed's timings offset by `SEED_SHIFT` (latencies, accuracies and training
times then vary by seed as `seed_factor` says). The constants are the answers
a test checks against.
"""
import json

from testbed.rundir import MANIFEST_SCHEMA
from workloads.runlog import SCHEMA_VERSION

MS = 1_000_000
PERIOD = 1000 * MS               # one round per second
# Arms run one after another, 100 s apart; the -tcp arms are the paper preset's.
T0 = {a: 10**18 + i * 100 * 10**9 for i, a in enumerate(
    ("gloo", "static", "dblp", "static-tcp", "dblp-tcp", "static-high", "dblp-slowed"))}
NORMAL = {"gloo": 40.0, "static": 30.0, "dblp": 24.0, "static-tcp": 30.0, "dblp-tcp": 24.0,
          "static-high": 20.0}  # ms
BURST = {"gloo": 800.0, "static": 400.0, "dblp": 100.0, "static-tcp": 900.0, "dblp-tcp": 150.0,
         "static-high": 80.0}
BURST_ROUNDS = (3, 7)
TRAIN = {"gloo": 3.0, "static": 2.0, "dblp": 1.5, "static-tcp": 2.5, "dblp-tcp": 1.6,
         "static-high": 1.2}
ACC = {"gloo": 0.97, "static": 0.96, "dblp": 0.95, "static-tcp": 0.96, "dblp-tcp": 0.955,
       "static-high": 0.90}
ROUNDS = 10
WORKERS = 3
GRAD = 10_000


# DBLP's deliberately slowed twin (testbed.config.arms.SLOWED): every figure 10 % worse.
NORMAL["dblp-slowed"], BURST["dblp-slowed"] = NORMAL["dblp"] * 1.1, BURST["dblp"] * 1.1
TRAIN["dblp-slowed"], ACC["dblp-slowed"] = TRAIN["dblp"] * 1.1, ACC["dblp"]


def latency(arm, r, burst=BURST):
    return burst[arm] if r in BURST_ROUNDS else NORMAL[arm]


def bound_of(arm, r):
    if arm == "gloo":
        return None
    if arm == "static-high":
        return 0.408
    if arm.startswith("static"):
        return 0.008
    return 0.008 if r < 2 else 0.408


def phase_of(arm, r):
    if arm == "gloo":
        return None
    return "critical" if bound_of(arm, r) == 0.008 else "relaxed"


SEED_SHIFT = 1000 * 10**9        # seed k+1's units start 1000 s after seed k's


def round_start(arm, r, seed=1):
    return T0[arm] + (seed - 1) * SEED_SHIFT + r * PERIOD


def unit_raw(run, arm, seed=1):
    """RUN/raw/<arm>/seed-<seed>: where a unit's logs are."""
    return run / "raw" / arm / f"seed-{seed}"


def seed_factor(seed):
    """How much slower every latency and training time of a seed is (seed 1: 1, seed 2: 1.5)."""
    return 1.0 + 0.5 * (seed - 1)


def manifest_data(name, arms, seeds=(1,), **fields) -> dict:
    """A manifest.json of the declared format, as the runner writes it at the end of a run."""
    units = [{"arm": a, "seed": s, "status": "ok", "started_ns": round_start(a, 0, s) - 2 * MS,
              "ended_ns": round_start(a, ROUNDS, s)} for s in seeds for a in arms]
    return {"schema": MANIFEST_SCHEMA, "raw_log_schema": SCHEMA_VERSION, "name": name,
            "seed": seeds[0], "seeds": list(seeds), "units": units, "status": "ok",
            "started_utc": "2026-01-01T00:00:00+00:00", "started_ns": 10**18, "pid": 1,
            "environment": {}, "capabilities": {}, **fields}


def make_run(tmp, arms=("gloo", "static", "dblp"), burst=BURST, acc=ACC, rtt_ms=5.0, seeds=(1,)):
    """Write a run directory with known timings; returns its path."""
    run = tmp
    for seed in seeds:
        _write_unit_logs(run, arms, burst, acc, seed)
    seeds_line = f"seed = {seeds[0]}\nseeds = {len(seeds)}\n"
    (run / "spec.toml").write_text(
        'name = "unit"\n' + seeds_line + 'arms = [' + ", ".join(f'"{a}"' for a in arms) + ']\n\n'
        f'[topology]\nbw_mbps = 20.0\n\n[placement]\nworkers = {WORKERS}\n\n'
        '[transport]\nrate_mbps = 0.0\np_static = 0.008\np_low = 0.008\np_high = 0.408\n\n'
        '[burst_every]\np = 0.8\n')
    extra = {"rtt_ms": rtt_ms} if rtt_ms is not None else {}
    (run / "manifest.json").write_text(json.dumps(manifest_data("unit", arms, seeds, **extra)))
    return run


def _write_unit_logs(run, arms, burst, acc, seed):
    f = seed_factor(seed)
    for arm in arms:
        d = unit_raw(run, arm, seed)
        d.mkdir(parents=True)
        for rank in range(WORKERS):
            lines = [{"event": "start", "arm": arm, "role": "worker", "rank": rank,
                      "model": "digits_cnn", "params": GRAD // 4, "grad_bytes": GRAD,
                      "world_size": WORKERS, "seed": seed, "t_ns": round_start(arm, 0, seed) - MS,
                      "rounds": ROUNDS}]
            for r in range(ROUNDS):
                ts = round_start(arm, r, seed)
                comm_start = ts + 10 * MS + rank * MS   # rank 2 is the last to start communicating
                end = ts + 12 * MS + int(latency(arm, r, burst) * f * MS)
                lines.append({"event": "round", "arm": arm, "role": "worker", "rank": rank,
                              "round": r, "epoch": 0, "t_start_ns": ts, "t_end_ns": end,
                              "compute_s": (comm_start - ts) / 1e9, "comm_s": (end - comm_start) / 1e9,
                              "bound": bound_of(arm, r),
                              "phase": phase_of(arm, r), "loss": 1.0 / (r + 1),
                              "stats": {} if arm == "gloo" else {
                                  "bytes_sent": 4000, "chunks_sent": 4,
                                  "retransmitted": 1 if r in BURST_ROUNDS else 0, "probe_rounds": 2}})
                if rank == 0 and r in (4, 9):
                    lines.append({"event": "eval", "arm": arm, "role": "worker", "rank": 0,
                                  "round": r, "epoch": 0, "t_ns": end + MS,
                                  "test_accuracy": acc[arm] - (0.1 if r == 4 else 0.0)
                                  - 0.01 * (seed - 1),
                                  "test_loss": 0.2})
            lines.append({"event": "end", "arm": arm, "role": "worker", "rank": rank,
                          "status": "ok", "train_time_s": (TRAIN[arm] - 0.1 * rank) * f})
            (d / f"worker{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        b1s = round_start(arm, 3, seed) + 11 * MS
        r6_end = round_start(arm, 6, seed) + 12 * MS + int(NORMAL[arm] * f * MS)
        b2_end = round_start(arm, 7, seed) + 500 * MS
        bursts = [
            {"event": "burst", "arm": arm, "seed": seed, "id": f"{arm}-b1", "kind": "loss",
             "target": "server-downlink", "params": {"p": 0.8}, "trigger": "round", "round": 3,
             "requested_start_ns": b1s - MS, "requested_end_ns": b1s + 50 * MS,
             "actual_start_ns": b1s, "actual_end_ns": b1s + 50 * MS, "dropped_packets": 12},
            # Starts 1 ms before round 6 ends: touches round 6, hits round 7 only.
            {"event": "burst", "arm": arm, "seed": seed, "id": f"{arm}-b2", "kind": "loss",
             "target": "server-downlink", "params": {"p": 0.8}, "trigger": "round", "round": 7,
             "requested_start_ns": r6_end - MS, "requested_end_ns": b2_end,
             "actual_start_ns": r6_end - MS, "actual_end_ns": b2_end,
             "dropped_packets": 8},
        ]
        (d / "bursts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in bursts))
