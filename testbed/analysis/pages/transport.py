"""The tables of a `bench transport` reference: round trips per loss, and the loose bound's speedup.

The bench (`testbed.bench.transport`) times one gradient's round trip on a
shaped veth pair under sustained loss, outside training; these tables say
what its rows mean together (missed deadlines, the worst ratio to the
bound, the tight bound over the loose one) so that no sentence about them
is typed by hand. `trip` and `sustained_sentence` are shared with the
line-rate and prototype-cost tables, which read the same kind of rows.
"""
from __future__ import annotations

import pathlib

from testbed.analysis.pages.cells import num, pct
from testbed.analysis.pages.files import read_json
from testbed.analysis.pages.registry import register

#: What a DBLP bench row's passes cost (`testbed.bench.transport_doc.COSTS`, which the
#: analysis may not import: the bench sits a floor above it).
COSTS = ("ours", "prototype")

#: The smallest burst-round speedup the paper reports (its 4.0-5.88x).
PAPER_LEAST_SPEEDUP = 4.0


def _bound_label(policy: str, bound: float) -> str:
    return "reliable" if policy == "reliable" else f"P {pct(bound)}"


def _column(row: dict) -> str:
    """A DBLP bench row's column: its bound and mode."""
    return f"{_bound_label(row['policy'], row['bound'])} {'PS' if row['mode'] == 'ps' else row['mode']}"


def trip(row: dict | None) -> str:
    """A bench row's median round trip (its ratio to the bound), or its missed deadline."""
    if row is None:
        return "–"
    if row.get("round_trip_s") is None:
        return f"> {row['round_timeout_s']:g} s"
    return f"{row['round_trip_s']:.3f} ({num(row.get('ratio'), '{:.2f}')})"


def round_trips_table(ref_dir: pathlib.Path) -> str:
    """`bench transport`: one row per loss, one column per DBLP bound and mode, gloo beside them.

    DBLP cells are the authenticated rows when there are any (a deployment
    has a secret); the last column is the range, over the row's DBLP
    columns, of the round trip with a secret over the same one without.
    After the table, what the rows say as a whole: missed deadlines, the
    worst ratio, passes against the ideal, and the loose bound's speedup.
    """
    doc = read_json(ref_dir / "bench-transport.json")
    rows = doc["rows"]
    dblp = [r for r in rows if r["impl"] == "dblp"]
    auth = any(r.get("auth") for r in dblp)
    shown = [r for r in dblp if bool(r.get("auth")) == auth]
    cols = sorted({(r["mode"], r["policy"], r["bound"]) for r in shown},
                  key=lambda c: (c[0] != "ps", c[2]))
    gloo = [r for r in rows if r["impl"] == "gloo"]
    twins = auth and any(not r.get("auth") for r in dblp)
    head = [_column({"mode": m, "policy": p, "bound": b}) for m, p, b in cols]
    head += ["gloo all-reduce"] if gloo else []
    head += ["secret on / off (range)"] if twins else []
    out = ["| loss p | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]

    def find(group, loss, mode, policy, bound, with_auth=auth):
        return next((r for r in group if r["loss"] == loss and r["mode"] == mode
                     and r["policy"] == policy and r["bound"] == bound
                     and bool(r.get("auth")) == with_auth), None)

    for loss in doc["losses"]:
        cells = [trip(find(shown, loss, *c)) for c in cols]
        if gloo:
            cells.append(trip(next((r for r in gloo if r["loss"] == loss), None)))
        if twins:
            ratios = [on["round_trip_s"] / off["round_trip_s"] for c in cols
                      for on, off in [(find(dblp, loss, *c), find(dblp, loss, *c, with_auth=False))]
                      if on and off and on["round_trip_s"] and off["round_trip_s"]]
            cells.append(f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "–")
        out.append(f"| {pct(loss)} | " + " | ".join(cells) + " |")
    text = "\n".join(out) + "\n\n"
    text += (f"Medians of {doc['reps']} round trips of {doc['bytes'] / (1 << 20):g} MiB at "
             f"{doc['rate_bps'] / 1e6:g} Mbit/s in seconds (time / `bound_s`; `floor_s` = "
             f"{doc['floor_s']:.3f} s). ")
    late = [r for r in rows if r.get("round_trip_s") is None]
    names = sorted({("gloo" if r["impl"] == "gloo" else _column(r)) + f" at {pct(r['loss'])}"
                    for r in late})
    deadline = rows[0]["round_timeout_s"] if rows else 0
    text += (f"Missed the {deadline:g} s deadline: {', '.join(names)}. " if names
             else f"No row missed its {deadline:g} s deadline. ")
    timed = [r for r in shown if r.get("ratio") is not None]
    if timed:
        w = max(timed, key=lambda r: r["ratio"])
        text += (f"The worst DBLP round trip is {w['ratio']:.2f}x its bound "
                 f"({_column(w)}, {pct(w['loss'])} loss).")
    top = max(doc["losses"], default=0)
    passes = [f"{num(r.get('passes'))} for {_bound_label(r['policy'], r['bound'])} "
              f"(ideal {r['ideal_passes']})" for r in shown
              if r["loss"] == top and r["mode"] == "ps" and r["policy"] == "static"]
    if top and passes:
        text += f" Passes at {pct(top)} loss (PS): {', '.join(passes)}."
    speed = [a["round_trip_s"] / b["round_trip_s"] for a in shown for b in shown
             if a["policy"] == b["policy"] == "static" and a["bound"] < b["bound"]
             and (a["loss"], a["mode"]) == (b["loss"], b["mode"])
             and a["round_trip_s"] and b["round_trip_s"]]
    if speed:
        both = "" if len(speed) == len({(r["loss"], r["mode"]) for r in shown}) else \
            " where both met the deadline"
        text += (f" The looser static bound's round trips are {min(speed):.2f}-{max(speed):.2f}x "
                 f"faster than the tighter one's at every loss and mode{both}.")
    return text + "\n"


def _ratio_range(tight: dict, loose: dict) -> tuple[float | None, float | None]:
    """The tight bound's round trip over the loose one's, at their repetitions' extremes.

    ``spread_s`` is a row's fastest and slowest round trip, the slowest None
    when one missed its deadline: the range is then open above.
    """
    (t_lo, t_hi), (l_lo, l_hi) = tight.get("spread_s") or (None, None), \
        loose.get("spread_s") or (None, None)
    lo = t_lo / l_hi if t_lo and l_hi else None
    hi = t_hi / l_lo if t_hi and l_lo else None
    return lo, hi


def loose_bound_pairs(doc: dict) -> list[dict]:
    """Each (loss, mode, control, costs) of a transport bench: its tightest and loosest static rows.

    The authenticated rows when there are any (a deployment has a secret).
    ``ratio`` is the median round trip of the tight bound over the loose one's
    (None when either missed its deadline), ``lo``/``hi`` its range at the
    repetitions' extremes. ``costs``: the rows' costs ("ours", or the
    prototype's with ``bench transport --costs``; documents before it: ours).
    """
    dblp = [r for r in doc["rows"] if r["impl"] == "dblp" and r["policy"] == "static"]
    auth = any(r.get("auth") for r in dblp)
    shown = [r for r in dblp if bool(r.get("auth")) == auth]
    if not shown:
        return []
    tight_b, loose_b = min(r["bound"] for r in shown), max(r["bound"] for r in shown)
    costs = [c for c in COSTS if any(costs_of(r) == c for r in shown)]
    pairs = []
    for loss in doc["losses"]:
        for mode in sorted({r["mode"] for r in shown}, key=lambda m: m != "ps"):
            for ctl in sorted({r["control"] for r in shown}):
                for cost in costs:
                    pick = {r["bound"]: r for r in shown if costs_of(r) == cost
                            and (r["loss"], r["mode"], r["control"]) == (loss, mode, ctl)}
                    tight, loose = pick.get(tight_b), pick.get(loose_b)
                    if tight is None or loose is None:
                        continue
                    t, lt = tight.get("round_trip_s"), loose.get("round_trip_s")
                    lo, hi = _ratio_range(tight, loose)
                    pairs.append({"loss": loss, "mode": mode, "control": ctl, "costs": cost,
                                  "tight": tight, "loose": loose,
                                  "ratio": t / lt if t and lt else None, "lo": lo, "hi": hi})
    return pairs


def costs_of(row: dict) -> str:
    """A DBLP bench row's costs (`COSTS`); rows made before the bench recorded them: ours."""
    return row.get("costs") or "ours"


def _costs_tag(pair: dict) -> str:
    return ", prototype costs" if pair.get("costs") == "prototype" else ""


def _pair_where(pair: dict) -> str:
    return (f"{pct(pair['loss'])} loss, {'PS' if pair['mode'] == 'ps' else pair['mode']} "
            f"{pair['control'].upper()}{_costs_tag(pair)}")


def _missed_ratio(pair: dict) -> str | None:
    """``> Nx`` when only the tight bound missed its deadline: the deadline over the loose one's."""
    tight, loose = pair["tight"], pair["loose"]
    if pair["ratio"] is not None or not loose.get("round_trip_s"):
        return None
    return f"> {tight['round_timeout_s'] / loose['round_trip_s']:.1f}x"


def _pair_ratio(pair: dict) -> str:
    """``median x (lo-hi)`` of a pair, or what its missed deadlines leave of it."""
    if pair["ratio"] is not None:
        hi = num(pair["hi"], "{:.2f}", none="")
        return f"{pair['ratio']:.2f}x ({num(pair['lo'], '{:.2f}')}-{hi})"
    missed = _missed_ratio(pair)
    if missed:
        return f"{missed} ({_bound_label('static', pair['tight']['bound'])} missed)"
    return "– (both missed)"


def loose_bound_table(ref_dir: pathlib.Path) -> str:
    """`bench transport`: the tightest static bound's round trip over the loosest's, per loss.

    The bench's form of the paper's speedup: one 4 MiB round trip under
    sustained loss, not a burst inside training. Its median ratio, the range
    of the ratio over the repetitions' extremes, the passes each bound made
    (the physics: a round costs its passes, each pass at least a control
    round trip) and, with TCP control, the retransmission timeouts that make
    a pass dear. After the table, where the ratio stands against the paper's
    4.0-5.88x.
    """
    doc = read_json(ref_dir / "bench-transport.json")
    pairs = loose_bound_pairs(doc)
    if not pairs:
        raise ValueError(f"{ref_dir}: the bench has no pair of static-bound rows")
    tight_l = _bound_label("static", pairs[0]["tight"]["bound"])
    loose_l = _bound_label("static", pairs[0]["loose"]["bound"])
    tcp = any(p["control"] == "tcp" for p in pairs)  # TCP's timeouts make its passes dear
    out = [f"| loss p | mode, control | {tight_l} | {loose_l} | {tight_l} / {loose_l} (range) "
           f"| passes {tight_l} / {loose_l} (ideal) |" + (" TCP timeouts |" if tcp else ""),
           "|---" * (7 if tcp else 6) + "|"]
    for pair in pairs:
        tight, loose = pair["tight"], pair["loose"]
        passes = (f"{num(tight.get('passes'))} / {num(loose.get('passes'))} "
                  f"({tight['ideal_passes']} / {loose['ideal_passes']})")
        rto = " / ".join(str((r.get("tcp") or {}).get("TcpExtTCPTimeouts", "–"))
                         for r in (tight, loose)) if pair["control"] == "tcp" else "–"
        out.append(f"| {pct(pair['loss'])} | {'PS' if pair['mode'] == 'ps' else pair['mode']}, "
                   f"{pair['control'].upper()}{_costs_tag(pair)} | {trip(tight)} | {trip(loose)} "
                   f"| {_pair_ratio(pair)} | {passes} |" + (f" {rto} |" if tcp else ""))
    text = "\n".join(out) + "\n\n"
    text += (f"Medians of {doc['reps']} round trips of {doc['bytes'] / (1 << 20):g} MiB at "
             f"{doc['rate_bps'] / 1e6:g} Mbit/s in seconds (time / `bound_s`); the range is the "
             "ratio at the repetitions' extremes (slowest over fastest and back), open above "
             "when a repetition missed its deadline. " + _loose_bound_sentence(pairs))
    cpu = [r for p in pairs for r in (p["tight"], p["loose"]) if r.get("cpu_busy_frac") is not None]
    if cpu:
        text += (f" The machine's CPU over these rows' round trips: at most "
                 f"{max(r['cpu_busy_frac'] for r in cpu):.0%} busy and "
                 f"{max(r.get('cpu_steal_frac') or 0 for r in cpu):.1%} stolen.")
    return text + "\n"


def _loose_bound_sentence(pairs: list[dict]) -> str:
    """Where the bench's ratio stands against the paper's least speedup, and where it cannot say."""
    whole = [p for p in pairs if p["lo"] is not None and p["lo"] >= PAPER_LEAST_SPEEDUP]
    median = [p for p in pairs if p not in whole and (p["ratio"] or 0) >= PAPER_LEAST_SPEEDUP]
    missed = [p for p in pairs if p["ratio"] is None]
    said = []
    if whole:
        said.append(f"Every repetition's ratio is at least {PAPER_LEAST_SPEEDUP:.1f}x at "
                    + ", ".join(f"{_pair_where(p)} ({_pair_ratio(p)})" for p in whole) + ".")
    if median:
        said.append(f"The median is at least {PAPER_LEAST_SPEEDUP:.1f}x, but not every "
                    "repetition's, at "
                    + ", ".join(f"{_pair_where(p)} ({_pair_ratio(p)})" for p in median) + ".")
    if not whole and not median:
        said.append(f"No median ratio reaches {PAPER_LEAST_SPEEDUP:.1f}x.")
    if missed:
        said.append("Deadlines leave no ratio at " + ", ".join(
            f"{_pair_where(p)} ({_pair_ratio(p)})" for p in missed) + ".")
    return " ".join(said)


def sustained_sentence(name: str, doc: dict) -> str:
    """A bench reference's tight-over-loose ratio at each loss, in one sentence for the cost table."""
    pairs = loose_bound_pairs(doc)
    if not pairs:
        raise ValueError(f"{name}: the bench has no pair of static-bound rows")

    def one(p):
        loss = pct(p["loss"])
        if p["ratio"] is None:
            missed = _missed_ratio(p)
            return f"{missed} at {loss} (a deadline missed)" if missed else \
                f"none at {loss} (both missed the deadline)"
        lo = num(p["lo"], "{:.2f}")
        spread = ("" if p["ratio"] < PAPER_LEAST_SPEEDUP
                  else f" (its repetitions {lo}-{p['hi']:.2f}x)" if p["hi"] is not None
                  else f" (its repetitions from {lo}x, one past the deadline)")
        return f"{p['ratio']:.2f}x at {loss}{spread}"
    reach = [pct(p["loss"]) for p in pairs if (p["ratio"] or 0) >= PAPER_LEAST_SPEEDUP]
    controls = "/".join(sorted({p["control"].upper() for p in pairs}))
    text = (f"Measured outside training, in the transport bench (`{name}`: {controls} control, "
            f"one {doc['bytes'] / (1 << 20):g} MiB round trip under sustained loss), the "
            f"{pct(pairs[0]['tight']['bound'])} bound's round trip over the "
            f"{pct(pairs[0]['loose']['bound'])} bound's is " + ", ".join(one(p) for p in pairs) + ". ")
    if reach:
        return text + (f"The median passes {PAPER_LEAST_SPEEDUP:.1f}x at {', '.join(reach)} "
                       "loss: where each extra pass pays TCP's retransmission timeouts, the "
                       "paper's range can come from the bound itself.")
    return text + f"No median reaches {PAPER_LEAST_SPEEDUP:.1f}x there either."


register("round-trips", round_trips_table)
register("loose-bound", loose_bound_table)
