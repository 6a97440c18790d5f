"""Resolve a spec's bursts into one explicit, seeded schedule for every arm.

The generator (`[burst_every]`) and the explicit `[[bursts]]` become a plain
list of burst requests before the first arm starts, so every arm is hit at
the same rounds by the same bursts, and the schedule is written into `raw/`.
"""
from __future__ import annotations

import random

from testbed.config.spec import Spec


def resolve_bursts(spec: Spec) -> list[dict]:
    rounds = spec["training"]["rounds"]
    out = []
    for b in spec.bursts:
        req = {"kind": b["kind"], "target": b["target"], "params": dict(b["params"])}
        if "at_round" in b:
            req.update(trigger="round", at_round=b["at_round"])
        else:
            req.update(trigger="time", at_s=b["at_s"])
        if "rounds" in b:
            req["rounds"] = b["rounds"]
            if "max_ms" in b:
                req["max_ms"] = b["max_ms"]
        else:
            req["duration_ms"] = b["duration_ms"]
        out.append(req)
    gen = spec["burst_every"]
    if gen["enabled"]:
        first = gen["start_round"]
        if gen["every"] > 0:
            hit = list(range(first, rounds, gen["every"]))
        else:
            candidates = list(range(first, rounds - gen["rounds"] + 1))
            n = round(gen["fraction"] * rounds)
            n = min(max(n, 1 if gen["fraction"] > 0 else 0), len(candidates))
            rng = random.Random(spec.seed)
            hit = sorted(rng.sample(candidates, n))
        taken = set()
        for r in hit:
            if any(r <= t < r + gen["rounds"] for t in taken):
                continue
            taken.update(range(r, r + gen["rounds"]))
            out.append({"kind": gen["kind"], "target": gen["target"], "params": {"p": gen["p"]},
                        "trigger": "round", "at_round": r, "rounds": gen["rounds"],
                        "max_ms": gen["max_ms"]})
    out.sort(key=lambda b: (b.get("at_round", -1), b.get("at_s", -1)))
    for i, b in enumerate(out):
        b["id"] = f"b{i:03d}"
    return out
