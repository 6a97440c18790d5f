"""Loss-tolerance sweep: final accuracy vs a forced gradient-drop fraction applied early, mid or late.

Reproduces the paper's motivation experiment without a network: N workers
are simulated in one process (same model init, shards and batch order as the
real workers), and in the chosen window every worker's pushed gradient loses
exactly ``round(f * chunks)`` chunks, zero-filled before a plain mean over
workers, which is what the dblp server does with missing chunks
(``missing="zero"``). Outside the window nothing is dropped.

``python -m workloads.sweep --out DIR`` (or ``dblp-testbed sweep``) writes
``sweep.csv``, ``sweep.json`` and ``report.md``.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

from .models import MODELS, build_model, get_spec, grad_bytes, make_optimizer
from .tasks import make_task
from .training import DEFAULT_MODEL

#: Payload bytes per data packet. The dblp transport's chunk size is used when
#: the package exposes it; 1,400 bytes (an MTU minus headers) otherwise.
DEFAULT_CHUNK_BYTES = 1400
PHASES = ("early", "middle", "late")


def transport_chunk_bytes() -> int:
    """Float32 payload bytes of one dblp DATA datagram (max datagram minus header)."""
    try:
        from dblp import wire
        for name in ("CHUNK_BYTES", "MAX_PAYLOAD", "CHUNK_PAYLOAD", "PAYLOAD_BYTES"):
            v = getattr(wire, name, None)
            if isinstance(v, int) and v > 0:
                return v - v % 4
        size = getattr(wire, "HEADER_SIZE", None) or getattr(wire, "HEADER_LEN", None)
        if isinstance(size, int) and isinstance(getattr(wire, "MAX_DATAGRAM", None), int):
            v = wire.MAX_DATAGRAM - size
            return v - v % 4
    except Exception:  # the transport is optional for the sweep
        pass
    return DEFAULT_CHUNK_BYTES


def drop_window(phase: str, rounds: int, window: float) -> range:
    """Rounds in which drops apply: the first, middle or last ``window`` share of training."""
    if phase not in PHASES:
        raise ValueError(f"--phases: unknown phase {phase!r}; choose from {PHASES}")
    if not 0 < window <= 1:
        raise ValueError(f"--window must be in (0, 1], got {window}")
    w = max(1, round(window * rounds))
    start = {"early": 0, "middle": (rounds - w) // 2, "late": rounds - w}[phase]
    return range(start, start + w)


def drop_chunks_(flat: torch.Tensor, fraction: float, chunk_floats: int, gen: np.random.Generator,
                 order: str = "random") -> int:
    """Zero ``round(fraction * chunks)`` chunks of ``flat`` in place; returns how many.

    ``random`` drops a seeded random subset (a transport sending in a
    per-round permuted order); ``tail`` drops the last chunks (a fixed send
    order stopped early, as in the paper's prototype).
    """
    n_chunks = math.ceil(flat.numel() / chunk_floats)
    k = int(round(fraction * n_chunks))
    if k == 0:
        return 0
    ids = (gen.choice(n_chunks, size=k, replace=False) if order == "random"
           else np.arange(n_chunks - k, n_chunks))
    view = flat.view(-1)
    for c in ids.tolist():
        view[c * chunk_floats:(c + 1) * chunk_floats] = 0.0
    return k


def train_with_drops(model_name: str, workers: int, rounds: int, seed: int, fraction: float,
                     window: range, chunk_bytes: int, order: str = "random", eval_every: int = 25,
                     lr: float | None = None, batch_size: int | None = None) -> dict:
    """Synchronous data-parallel training of ``workers`` simulated workers; returns the curve."""
    spec = get_spec(model_name)
    batch_size = batch_size or spec.batch_size
    torch.manual_seed(seed)
    model = build_model(model_name, seed)
    opt = make_optimizer(spec, model.parameters(), lr)
    tasks = [make_task(spec, r, workers, batch_size, seed) for r in range(workers)]
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    chunk_floats = max(1, chunk_bytes // 4)
    acc_buf, flat = torch.zeros(n), torch.zeros(n)
    curve, dropped = [], 0
    model.train()
    for r in range(rounds):
        acc_buf.zero_()
        for w in range(workers):
            x, y = tasks[w].batches.batch(r)
            model.zero_grad(set_to_none=False)
            tasks[w].loss_fn(model(x), y).backward()
            torch.cat([p.grad.reshape(-1) for p in params], out=flat)
            if fraction > 0 and r in window:
                gen = np.random.default_rng([seed, r, w, 7])
                dropped += drop_chunks_(flat, fraction, chunk_floats, gen, order)
            acc_buf.add_(flat)
        acc_buf.div_(workers)            # plain mean, zeros included (no rescaling)
        off = 0
        for p in params:
            p.grad.copy_(acc_buf[off:off + p.numel()].view_as(p))
            off += p.numel()
        opt.step()
        if (r + 1) % eval_every == 0 or r == rounds - 1:
            a, loss = tasks[0].evaluate(model)
            curve.append({"round": r, "test_accuracy": a, "test_loss": loss})
    total_chunks = rounds * workers * math.ceil(n / chunk_floats)
    return {"curve": curve, "final_accuracy": curve[-1]["test_accuracy"],
            "final_loss": curve[-1]["test_loss"], "dropped_chunks": dropped,
            "dropped_share_of_training": dropped / total_chunks}


def _acc_after_window(curve: list[dict], window: range) -> float:
    """Accuracy at the first evaluation after the drop window closed (how big the gap was)."""
    for pt in curve:
        if pt["round"] >= window.stop - 1:
            return pt["test_accuracy"]
    return curve[-1]["test_accuracy"]


def run_sweep(out: str, model: str = DEFAULT_MODEL, workers: int = 3, rounds: int = 300,
              fractions=(0.0, 0.2, 0.4, 0.6, 0.8), phases=PHASES, window: float = 0.25,
              seeds=(0, 1, 2), order: str = "random", chunk_bytes: int | None = None,
              eval_every: int = 25, log=print) -> dict:
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if rounds < 2:
        raise ValueError(f"--rounds must be >= 2, got {rounds}")
    if order not in ("random", "tail"):
        raise ValueError(f"--order must be 'random' or 'tail', got {order!r}")
    for f in fractions:
        if not 0 <= f < 1:
            raise ValueError(f"--fractions: each must be in [0, 1), got {f}")
    chunk_bytes = chunk_bytes or transport_chunk_bytes()
    os.makedirs(out, exist_ok=True)
    gb = grad_bytes(build_model(model, 0))
    log(f"sweep: model {model} (gradient {gb} bytes = {math.ceil(gb / chunk_bytes)} chunks of "
        f"{chunk_bytes} B), {workers} workers, {rounds} rounds, window {window:.0%}, seeds {list(seeds)}")
    rows = []
    t0 = time.perf_counter()
    for seed in seeds:
        base = train_with_drops(model, workers, rounds, seed, 0.0, range(0), chunk_bytes, order,
                                eval_every)
        for phase in phases:
            win = drop_window(phase, rounds, window)
            rows.append(_row(seed, phase, 0.0, win, base, base))
        for f in [x for x in fractions if x > 0]:
            for phase in phases:
                win = drop_window(phase, rounds, window)
                res = train_with_drops(model, workers, rounds, seed, f, win, chunk_bytes, order,
                                       eval_every)
                rows.append(_row(seed, phase, f, win, res, base))
                log(f"  seed {seed} {phase:6s} drop {f:.0%}: final accuracy "
                    f"{res['final_accuracy']:.4f} (no drops {base['final_accuracy']:.4f})")
    elapsed = time.perf_counter() - t0
    summary = _summarize(rows, fractions, phases)
    meta = {"model": model, "workers": workers, "rounds": rounds, "window": window,
            "seeds": list(seeds), "order": order, "chunk_bytes": chunk_bytes, "grad_bytes": gb,
            "fractions": list(fractions), "phases": list(phases), "elapsed_s": elapsed}
    with open(os.path.join(out, "sweep.csv"), "w", newline="") as fh:
        cols = [k for k in rows[0] if k != "curve"]
        wr = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        wr.writeheader()
        wr.writerows(rows)
    with open(os.path.join(out, "sweep.json"), "w") as fh:
        json.dump({"meta": meta, "summary": summary, "runs": rows}, fh, indent=1)
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(render_report(meta, summary))
    log(f"sweep: {len(rows)} rows in {elapsed:.0f} s -> {out}/report.md")
    return {"meta": meta, "summary": summary, "rows": rows}


def _acc_at(curve: list[dict], round_: int) -> float:
    for pt in curve:
        if pt["round"] >= round_:
            return pt["test_accuracy"]
    return curve[-1]["test_accuracy"]


def _row(seed, phase, f, win, res, base) -> dict:
    after = _acc_after_window(res["curve"], win)
    return {"seed": seed, "phase": phase, "drop_fraction": f, "window_start": win.start,
            "window_end": win.stop, "final_accuracy": res["final_accuracy"],
            "final_loss": res["final_loss"], "accuracy_after_window": after,
            "gap_after_window": after - _acc_at(base["curve"], win.stop - 1),
            "dropped_chunks": res["dropped_chunks"],
            "dropped_share_of_training": res["dropped_share_of_training"], "curve": res["curve"]}


def _summarize(rows, fractions, phases) -> dict:
    """Per (phase, fraction): median and spread of final accuracy over seeds, and the drop vs no drops."""
    base = {r["seed"]: r["final_accuracy"] for r in rows if r["drop_fraction"] == 0}
    out = {}
    for phase in phases:
        for f in fractions:
            sel = [r for r in rows if r["phase"] == phase and r["drop_fraction"] == f]
            if not sel:
                continue
            accs = [r["final_accuracy"] for r in sel]
            deltas = [r["final_accuracy"] - base[r["seed"]] for r in sel]
            losses = [r["final_loss"] for r in sel]
            out[f"{phase}@{f:g}"] = {
                "phase": phase, "drop_fraction": f, "n": len(sel),
                "final_accuracy_median": statistics.median(accs),
                "final_accuracy_min": min(accs), "final_accuracy_max": max(accs),
                "delta_vs_no_drop_mean": statistics.fmean(deltas),
                "final_loss_median": statistics.median(losses),
                "gap_after_window_mean": statistics.fmean(r["gap_after_window"] for r in sel),
            }
    return out


def render_report(meta: dict, summary: dict) -> str:
    phases, fr = meta["phases"], meta["fractions"]
    L = ["# Loss-tolerance sweep", "",
         f"Model `{meta['model']}` ({meta['grad_bytes']} B gradient, chunks of {meta['chunk_bytes']} B), "
         f"{meta['workers']} simulated workers, {meta['rounds']} rounds, seeds {meta['seeds']}. "
         f"In the drop window ({meta['window']:.0%} of the rounds: first, middle or last) every worker "
         f"loses the given fraction of its gradient chunks ({meta['order']} order), zero-filled before a "
         f"plain mean, as the dblp server does; no drops outside the window.", "",
         "Final test accuracy, median over seeds (min-max), and mean change against the same seed "
         "without drops, in points:", "",
         "| drop | " + " | ".join(phases) + " |", "|---|" + "---|" * len(phases)]
    for f in fr:
        cells = []
        for ph in phases:
            s = summary.get(f"{ph}@{f:g}")
            cells.append("" if s is None else
                         f"{100 * s['final_accuracy_median']:.2f} ({100 * s['final_accuracy_min']:.1f}-"
                         f"{100 * s['final_accuracy_max']:.1f}), {100 * s['delta_vs_no_drop_mean']:+.2f}")
        L.append(f"| {f:.0%} | " + " | ".join(cells) + " |")
    L += ["", "Final test loss (median):", "", "| drop | " + " | ".join(phases) + " |",
          "|---|" + "---|" * len(phases)]
    for f in fr:
        L.append(f"| {f:.0%} | " + " | ".join(
            f"{summary[f'{ph}@{f:g}']['final_loss_median']:.4f}" if f"{ph}@{f:g}" in summary else ""
            for ph in phases) + " |")
    L += ["", "Accuracy gap right after the drop window closed (mean over seeds, points, against the "
          "same seed without drops at the same round): how much was lost before recovery began.", "",
          "| drop | " + " | ".join(phases) + " |", "|---|" + "---|" * len(phases)]
    for f in fr:
        L.append(f"| {f:.0%} | " + " | ".join(
            f"{100 * summary[f'{ph}@{f:g}']['gap_after_window_mean']:+.2f}" if f"{ph}@{f:g}" in summary
            else "" for ph in phases) + " |")
    L += ["", "## Verdict", "", verdict(meta, summary), ""]
    return "\n".join(L)


def verdict(meta: dict, summary: dict) -> str:
    """Plain-language answer to: do early drops hurt more than late ones on this workload?"""
    hi = [f for f in meta["fractions"] if f >= 0.4]
    if not hi or "early" not in meta["phases"] or "late" not in meta["phases"]:
        return "Not enough phases/fractions to compare early against late drops."
    early = statistics.fmean(summary[f"early@{f:g}"]["delta_vs_no_drop_mean"] for f in hi)
    late = statistics.fmean(summary[f"late@{f:g}"]["delta_vs_no_drop_mean"] for f in hi)
    el = statistics.fmean(summary[f"early@{f:g}"]["final_loss_median"] for f in hi)
    ll = statistics.fmean(summary[f"late@{f:g}"]["final_loss_median"] for f in hi)
    eg = statistics.fmean(summary[f"early@{f:g}"]["gap_after_window_mean"] for f in hi)
    lg = statistics.fmean(summary[f"late@{f:g}"]["gap_after_window_mean"] for f in hi)
    seeds = len(meta["seeds"])
    resolution = 100.0 / 360  # one digits test example, in points
    head = (f"Averaged over drop fractions {', '.join(f'{f:.0%}' for f in hi)} and {seeds} seeds: "
            f"right after the window, early drops leave the model {100 * eg:+.2f} points behind the "
            f"no-drop run, late drops {100 * lg:+.2f} points. At the end of training early drops "
            f"change accuracy by {100 * early:+.2f} points, late drops by {100 * late:+.2f} "
            f"(final test loss {el:.4f} early vs {ll:.4f} late)")
    if meta["model"].startswith("digits"):
        head += f"; one digits test example is {resolution:.2f} points"
    head += ". "
    hurt_more_now = eg < lg - 0.01
    if early < late - 0.005 and el > ll:
        return head + ("Early drops hurt more than late ones and the gap persists to the end of "
                       "training, as the paper reports.")
    if abs(early - late) <= 0.005:
        return head + (("Early drops hurt more while they happen, " if hurt_more_now else "")
                       + "but on this workload the final difference is within half a point: the model "
                       "recovers from early gradient loss before training ends, so the paper's 'gap "
                       "that never closes' is not reproduced at this budget.")
    return head + ("On this workload late drops hurt at least as much as early ones at the end: "
                   "it disagrees with the paper.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workloads.sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory (sweep.csv, sweep.json, report.md)")
    ap.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--fractions", default="0,0.2,0.4,0.6,0.8", help="comma-separated drop fractions")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--window", type=float, default=0.25, help="share of the rounds a phase window spans")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--order", choices=("random", "tail"), default="random")
    ap.add_argument("--chunk-bytes", type=int, default=None)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    try:
        fractions = [float(x) for x in a.fractions.split(",") if x.strip()]
        seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    except ValueError as e:
        raise SystemExit(f"--fractions/--seeds: {e}") from None
    phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    torch.set_num_threads(max(1, a.threads))
    try:
        run_sweep(a.out, a.model, a.workers, a.rounds, fractions, phases, a.window, seeds, a.order,
                  a.chunk_bytes, a.eval_every, log=lambda s: print(s, file=sys.stderr, flush=True))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
