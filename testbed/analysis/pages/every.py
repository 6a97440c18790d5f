"""The tables of the block ``all`` (`testbed.references.EVERY`): wall times and the prototype's costs.

Each reads several references at once, from the reference root, so it is
registered ``every``: the wall time of every reference (its
reproduce.json), and the burst-round ratio as each of the prototype's
costs is added, one run reference per step (`testbed.references.PROTOTYPE_COSTS`).
"""
from __future__ import annotations

import pathlib

from testbed.analysis.pages.cells import figure, interval, num
from testbed.analysis.pages.files import load_summary, read_json
from testbed.analysis.pages.registry import register
from testbed.analysis.pages.transport import PAPER_LEAST_SPEEDUP, sustained_sentence


def wall_times_table(reference_dir: pathlib.Path) -> str:
    """Every reference's commands and wall time (reproduce.json), and their sum."""
    from testbed.references import REFERENCES, read_record

    out = ["| reference | commands | wall time |", "|---|---|---|"]
    total = 0.0
    for name in REFERENCES:
        rec = read_record(reference_dir / name)
        argvs = [c["argv"] for c in rec["commands"]] if "commands" in rec else [rec["argv"]]
        total += rec["wall_s"]
        # Commands repeated for several runs (the same argv but the file it writes) once.
        runs: dict[tuple, list[list[str]]] = {}
        for a in argvs:
            runs.setdefault(tuple(a[:-1]) if a[-2:-1] == ["--json"] else tuple(a), []).append(a)
        cmds = "<br>".join(f"`dblp-testbed {' '.join(g[0])}`"
                           + (f" and {len(g) - 1} more runs of it" if len(g) > 1 else "")
                           for g in runs.values())
        out.append(f"| {name} | {cmds} | {rec['wall_s'] / 60:.1f} min |")
    out.append(f"| all, one after another | `dblp-testbed reproduce` | {total / 60:.1f} min |")
    return "\n".join(out) + "\n"


#: The pairs of the prototype's cost table: (control path, arm, baseline).
COST_PAIRS = (("UDP", "dblp", "static"), ("TCP", "dblp-tcp", "static-tcp"))


def _burst_speedup(summary: dict, arm: str, baseline: str) -> dict | None:
    """The burst-round speedup verdict of ``arm`` over ``baseline``, if the run judged it."""
    for v in summary.get("verdicts", []):
        if v["claim"] == "burst_speedup" and v.get("arm") == arm and v.get("baseline") == baseline:
            return v
    return None


def _burst_verdict(summary: dict, arm: str, baseline: str) -> str:
    """``point [lo, hi]x verdict`` of the burst-round speedup of ``arm`` over ``baseline``."""
    from testbed.analysis.answer import verdict_label
    v = _burst_speedup(summary, arm, baseline)
    return "–" if v is None else f"{figure(v)} {verdict_label(v)}"


def _costs_sentence(steps: list[tuple[str, dict]]) -> str:
    """Where the paper's 4.0-5.9x can and cannot come from, read off the table's intervals."""
    judged = [(name, ctl, v["interval"]) for name, summary in steps
              for ctl, arm, base in COST_PAIRS
              if (v := _burst_speedup(summary, arm, base)) and (v.get("interval") or {}).get("hi")]
    if not judged:
        return "No step of the table has an interval yet."
    top = max(judged, key=lambda j: j[2]["point"])
    reach = [f"`{name}` ({ctl})" for name, ctl, iv in judged if iv["hi"] >= PAPER_LEAST_SPEEDUP]
    head = (f"The largest ratio is {interval(top[2])}x (`{top[0]}`, {top[1]} control). ")
    if not reach:
        return (head + f"No interval reaches {PAPER_LEAST_SPEEDUP:.1f}x: the paper's 4.0-5.9x "
                "cannot come from the costs in these rows (each row keeps the costs above it).")
    return (head + f"The intervals that reach {PAPER_LEAST_SPEEDUP:.1f}x, where the paper's "
            f"4.0-5.9x can come from: {', '.join(reach)}; the other steps' cannot.")


def _burst_rounds(summary: dict, arm: str, baseline: str) -> str:
    """Both arms' burst-round p50, ``baseline / arm`` in seconds."""
    arms = summary.get("arms", {})
    ms = [(arms.get(a) or {}).get("burst_round_ms_p50") for a in (baseline, arm)]
    return " / ".join(num(None if m is None else m / 1000, "{:.2f}") for m in ms) + " s"


def prototype_costs_table(reference_dir: pathlib.Path) -> str:
    """The burst-round ratio as each of the prototype's costs is added (`PROTOTYPE_COSTS`).

    One row per step, each its own run reference (a run of the same preset,
    seeds and bursts with one more cost): the speedup of dblp over static
    with its interval and verdict, for each control path, and the two arms'
    burst rounds it is the ratio of.
    """
    from testbed.references import PROTOTYPE_COSTS, SUSTAINED_LOSS

    head = ["| costs of the prototype |"]
    for ctl, arm, base in COST_PAIRS:
        head.append(f" {ctl} control: {arm} vs {base}, burst rounds | {base} / {arm} p50 |")
    rows = ["".join(head), "|---" * (1 + 2 * len(COST_PAIRS)) + "|"]
    steps = []
    for step in PROTOTYPE_COSTS:
        summary = load_summary(reference_dir / step.reference)
        steps.append((step.reference, summary))
        cells = [f"{step.adds} (`{step.reference}`)"]
        for _, arm, base in COST_PAIRS:
            cells += [_burst_verdict(summary, arm, base), _burst_rounds(summary, arm, base)]
        rows.append("| " + " | ".join(cells) + " |")
    text = "\n".join(rows) + "\n\n" + _costs_sentence(steps)
    bench = reference_dir / SUSTAINED_LOSS / "bench-transport.json"
    if bench.is_file():
        text += " " + sustained_sentence(SUSTAINED_LOSS, read_json(bench))
    return text + "\n"


register("wall-times", wall_times_table, every=True)
register("prototype-costs", prototype_costs_table, every=True)
