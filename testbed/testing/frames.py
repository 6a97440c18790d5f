"""Rounds and evaluations tables drawn from known truths, for tests of the intervals.

`synthetic` builds rounds and evals tables of the declared columns (with
the `seed` column repeated runs add) from distributions whose true figures
are known: burst-round latencies lognormal around a chosen median,
round windows around a chosen mean, final accuracies around a chosen value,
each with a per-seed random effect so that seeds differ as real runs do.
"""
import math

import numpy as np
import pandas as pd

MS = 1_000_000
# arm -> (burst-round median ms, normal-round ms, round window ms, final accuracy)
TRUTH = {"static": (500.0, 30.0, 100.0, 0.900),
         "dblp": (100.0, 24.0, 75.0, 0.897),
         "static-high": (80.0, 20.0, 70.0, 0.880),
         "gloo": (800.0, 40.0, 120.0, 0.905)}
SYNTH_ROUNDS = 60
BURST_EVERY = 6          # rounds 0, 6, 12, ...: 10 burst rounds per seed
EVAL_EVERY = 10


def synthetic(seeds=(1, 2, 3), arms=("static", "dblp"), seed_sd=0.05, round_sd=0.2,
              acc_sd=0.002, rng=0, truth=TRUTH, rounds=SYNTH_ROUNDS):
    """(rounds, evals) frames with per-seed effects; every figure's true value follows TRUTH."""
    g = np.random.default_rng(rng)
    rows, evals = [], []
    for arm in arms:
        burst_med, normal, window, acc = truth[arm]
        for s in seeds:
            effect = math.exp(g.normal(0, seed_sd))
            t = 10**18 + (list(truth).index(arm) * 1000 + s) * 10**12
            for r in range(rounds):
                burst = r % BURST_EVERY == 0
                lat = (burst_med if burst else normal) * effect * math.exp(g.normal(0, round_sd))
                dur = window * effect * math.exp(g.normal(0, round_sd)) + (lat if burst else 0)
                rows.append({"arm": arm, "seed": s, "round": r, "t_start_ns": t,
                             "t_end_ns": t + int(dur * MS), "duration_ms": dur,
                             "latency_ms": lat, "in_burst": burst})
                t += int(dur * MS) + 2 * MS
                if (r + 1) % EVAL_EVERY == 0:
                    # Accuracy climbs to its final value over the run.
                    a = acc * (0.5 + 0.5 * (r + 1) / rounds) + g.normal(0, acc_sd)
                    evals.append({"arm": arm, "seed": s, "round": r, "rank": 0,
                                  "t_s": math.nan, "test_accuracy": a, "test_loss": 1 - a})
    return pd.DataFrame(rows), pd.DataFrame(evals)
