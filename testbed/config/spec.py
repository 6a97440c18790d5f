"""Experiment specs: TOML in, one validated, fully resolved `Spec` out.

A spec is read with the standard library (`tomllib`), merged over a preset,
overridden from the command line, and validated field by field *before*
anything touches the machine, so a typo costs one line of error and nothing
else. Every error names the field and says how to fix it.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
import tomllib
from typing import Any

from controllers.bursts import SPEC_KEYS, BurstError, BurstEvery, spec_bursts
from controllers.targets import TargetError, resolve_target
from testbed.errors import InputError

# Arms: name -> (transport, control path, mode). `transport` is what the
# workload runs; control and mode only matter for the dblp transports. "ps":
# the workers push to an aggregation server and pull the average back (the
# paper's design); "sharded": no server, each worker aggregates 1/N of the
# gradient, the like-for-like peer of gloo's all-reduce (every link carries
# a share, no link carries everything).
ARMS = {
    "local": ("local", None, None),
    "gloo": ("gloo", None, None),
    "reliable": ("reliable", "udp", "ps"),
    "static": ("static", "udp", "ps"),
    "dblp": ("dblp", "udp", "ps"),
    "reliable-tcp": ("reliable", "tcp", "ps"),
    "static-tcp": ("static", "tcp", "ps"),
    "dblp-tcp": ("dblp", "tcp", "ps"),
    "reliable-sharded": ("reliable", "udp", "sharded"),
    "static-sharded": ("static", "udp", "sharded"),
    "dblp-sharded": ("dblp", "udp", "sharded"),
}
TOPOLOGY_KINDS = ("fattree", "star", "leafspine")
MODELS = ("digits_cnn", "digits_resnet", "transformer_lm")
MISSING_MODES = ("zero", "mean", "error_feedback")
LR_SCHEDULES = ("constant", "cosine")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class SpecError(InputError):
    """A spec field is wrong; the message names it and the fix."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        super().__init__(f"spec field '{field}': {problem}; {fix}")


# The schema: section -> field -> (type, default). Defaults here are the
# `default` preset's; presets override some of them.
SCHEMA: dict[str, dict[str, tuple[type | tuple, Any]]] = {
    "": {
        "name": (str, "default"),
        "seed": (int, 1),
        "arms": (list, ["gloo", "static", "dblp"]),
        "description": (str, ""),
    },
    "topology": {
        "kind": (str, "fattree"),
        "k": (int, 4),
        "leaves": (int, 4),
        "spines": (int, 2),
        "hosts_per_leaf": (int, 2),
        "bw_mbps": ((int, float), 20.0),
        "queue_pkts": (int, 100),
    },
    "placement": {
        "workers": (int, 4),
        # "spread": server and workers in different pods where the topology
        # has pods; "packed": fill hosts in order.
        "strategy": (str, "spread"),
    },
    "training": {
        "model": (str, "digits_cnn"),
        "rounds": (int, 300),
        "batch_size": (int, 0),      # 0: the model's own default
        "lr": ((int, float), 0.0),   # 0: the model's own default
        "lr_schedule": (str, "constant"),  # or "cosine": decay to zero over the rounds
        "eval_every": (int, 50),
    },
    "transport": {
        "missing": (str, "zero"),
        "p_static": ((int, float), 0.008),
        "p_low": ((int, float), 0.008),
        "p_high": ((int, float), 0.408),
        "threshold": ((int, float), 0.5),
        "check_every": (int, 10),
        "rate_mbps": ((int, float), 0.0),  # 0: pace at the link rate
        "round_deadline_s": ((int, float), 30.0),
    },
    # The burst generator; its fields, defaults and ranges live in controllers.bursts.
    "burst_every": BurstEvery.schema(),
    "capture": {
        "enabled": (bool, True),
        "hosts": (list, ["server", "worker0"]),
        "snaplen": (int, 96),
    },
    "limits": {
        "arm_timeout_s": ((int, float), 600.0),
    },
}


@dataclasses.dataclass(frozen=True)
class Spec:
    """A validated experiment: plain data, safe to write back as TOML."""

    data: dict

    def __getitem__(self, section: str) -> dict:
        return self.data[section]

    @property
    def name(self) -> str:
        return self.data[""]["name"]

    @property
    def seed(self) -> int:
        return self.data[""]["seed"]

    @property
    def arms(self) -> list[str]:
        return list(self.data[""]["arms"])

    @property
    def bursts(self) -> list[dict]:
        return list(self.data["bursts"])

    def to_toml(self) -> str:
        return dumps_toml(self.data)


def defaults() -> dict:
    data = {sec: {k: copy.deepcopy(v[1]) for k, v in fields.items()}
            for sec, fields in SCHEMA.items()}
    data["bursts"] = []
    return data


def _type_name(t) -> str:
    if isinstance(t, tuple):
        return "number"
    return {int: "integer", float: "number", str: "string", bool: "true/false",
            list: "list", dict: "table"}[t]


def _check_type(field: str, value, t):
    ok = isinstance(value, t) and not (t is not bool and not (isinstance(t, tuple) and bool in t)
                                       and isinstance(value, bool))
    if not ok:
        raise SpecError(field, f"expected {_type_name(t)}, got {value!r}",
                        f"write it as a TOML {_type_name(t)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(field, f"{value!r} is not a finite number", "use a finite number")


def merge(base: dict, doc: dict, origin: str = "spec") -> dict:
    """Merge a parsed TOML document over `base`, rejecting unknown fields."""
    out = copy.deepcopy(base)
    for key, value in doc.items():
        if key == "bursts":
            out["bursts"] = _bursts(value)
        elif key in SCHEMA and key != "":
            if not isinstance(value, dict):
                raise SpecError(key, "expected a table", f"write it as [{key}]")
            for fkey, fval in value.items():
                if fkey not in SCHEMA[key]:
                    raise SpecError(f"{key}.{fkey}", "unknown field",
                                    f"remove it; known fields: {', '.join(SCHEMA[key])}")
                _check_type(f"{key}.{fkey}", fval, SCHEMA[key][fkey][0])
                out[key][fkey] = fval
        elif key in SCHEMA[""]:
            _check_type(key, value, SCHEMA[""][key][0])
            out[""][key] = value
        else:
            known = [k for k in SCHEMA if k] + list(SCHEMA[""]) + ["bursts"]
            raise SpecError(key, "unknown field", f"remove it; known: {', '.join(sorted(known))}")
    return out


def _bursts(tables) -> list[dict]:
    """`[[bursts]]` as written, each checked by controllers.bursts and completed with its defaults."""
    try:
        return [b.to_dict(SPEC_KEYS) for b in spec_bursts(tables)]
    except BurstError as exc:
        raise SpecError(exc.field, exc.problem, exc.fix) from None


def parse_override(text: str) -> tuple[str, str, Any]:
    """`training.rounds=50` -> ("training", "rounds", 50); values are TOML."""
    if "=" not in text:
        raise SpecError(text, "override is not KEY=VALUE", "write e.g. --set training.rounds=50")
    key, raw = text.split("=", 1)
    key = key.strip()
    section, _, field = key.rpartition(".")
    if section not in SCHEMA or field not in SCHEMA[section]:
        raise SpecError(key, "unknown field", "use SECTION.FIELD, e.g. training.rounds")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: take it as a string
    return section, field, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    out = copy.deepcopy(data)
    for text in overrides:
        section, field, value = parse_override(text)
        name = f"{section}.{field}" if section else field
        if SCHEMA[section][field][0] is list and isinstance(value, str):
            value = [v for v in value.split(",") if v]
        _check_type(name, value, SCHEMA[section][field][0])
        out[section][field] = value
    return out


def _in(field, value, lo, hi, fix, lo_open=False, hi_open=False):
    bad = (value <= lo if lo_open else value < lo) or (value >= hi if hi_open else value > hi)
    if bad:
        lb = "(" if lo_open else "["
        hb = ")" if hi_open else "]"
        raise SpecError(field, f"{value!r} is out of range {lb}{lo}, {hi}{hb}", fix)


def validate(data: dict) -> Spec:
    """Check every value's range and the fields' consistency."""
    top, topo, place = data[""], data["topology"], data["placement"]
    train, tr, cap = data["training"], data["transport"], data["capture"]
    if not NAME_RE.match(top["name"]):
        raise SpecError("name", f"{top['name']!r} is not a plain name",
                        "use letters, digits, '.', '_' or '-' (no spaces, slashes or shell characters)")
    _in("seed", top["seed"], 0, 2**31 - 1, "use a seed between 0 and 2147483647")
    if not top["arms"]:
        raise SpecError("arms", "no arms", f"list at least one of: {', '.join(ARMS)}")
    for a in top["arms"]:
        if a not in ARMS:
            raise SpecError("arms", f"unknown arm {a!r}", f"choose from: {', '.join(ARMS)}")
    if len(set(top["arms"])) != len(top["arms"]):
        raise SpecError("arms", "an arm is listed twice", "list each arm once")

    if topo["kind"] not in TOPOLOGY_KINDS:
        raise SpecError("topology.kind", f"unknown topology {topo['kind']!r}",
                        f"choose from: {', '.join(TOPOLOGY_KINDS)}")
    if topo["kind"] == "fattree" and (topo["k"] % 2 or not 4 <= topo["k"] <= 8):
        raise SpecError("topology.k", f"{topo['k']} is not an even number in 4..8",
                        "set topology.k to 4, 6 or 8")
    _in("topology.leaves", topo["leaves"], 2, 16, "use 2..16 leaves")
    _in("topology.spines", topo["spines"], 1, 8, "use 1..8 spines")
    _in("topology.hosts_per_leaf", topo["hosts_per_leaf"], 1, 8, "use 1..8 hosts per leaf")
    _in("topology.bw_mbps", topo["bw_mbps"], 0, 1000, "use a rate in (0, 1000] Mbit/s", lo_open=True)
    _in("topology.queue_pkts", topo["queue_pkts"], 2, 1000, "use a queue of 2..1000 packets")

    hosts = {"fattree": topo["k"] ** 3 // 4, "star": 65,
             "leafspine": topo["leaves"] * topo["hosts_per_leaf"]}[topo["kind"]]
    _in("placement.workers", place["workers"], 1, 64, "use 1..64 workers")
    if place["workers"] + 1 > hosts:
        raise SpecError("placement.workers", f"{place['workers']} workers + 1 server need "
                        f"{place['workers'] + 1} hosts but the topology has {hosts}",
                        "use fewer workers or a larger topology")
    if place["strategy"] not in ("spread", "packed"):
        raise SpecError("placement.strategy", f"unknown strategy {place['strategy']!r}",
                        "use 'spread' or 'packed'")

    if train["model"] not in MODELS:
        raise SpecError("training.model", f"unknown model {train['model']!r}",
                        f"choose from: {', '.join(MODELS)}")
    _in("training.rounds", train["rounds"], 1, 100_000, "use 1..100000 rounds")
    _in("training.batch_size", train["batch_size"], 0, 4096,
        "use 0 (the model's default) or a batch of 1..4096")
    _in("training.lr", train["lr"], 0, 10, "use 0 (the model's default) or a rate in (0, 10]")
    if train["lr_schedule"] not in LR_SCHEDULES:
        raise SpecError("training.lr_schedule", f"unknown schedule {train['lr_schedule']!r}",
                        f"choose from: {', '.join(LR_SCHEDULES)}")
    _in("training.eval_every", train["eval_every"], 1, 100_000, "evaluate every 1..100000 rounds")

    if tr["missing"] not in MISSING_MODES:
        raise SpecError("transport.missing", f"unknown mode {tr['missing']!r}",
                        f"choose from: {', '.join(MISSING_MODES)}")
    for f in ("p_static", "p_low", "p_high"):
        _in(f"transport.{f}", tr[f], 0, 1, "use a loss bound in [0, 1)", hi_open=True)
    if tr["p_high"] < tr["p_low"]:
        raise SpecError("transport.p_high", f"{tr['p_high']} is below p_low {tr['p_low']}",
                        "set p_high >= p_low")
    _in("transport.threshold", tr["threshold"], 0, 10, "use a threshold in (0, 10]", lo_open=True)
    _in("transport.check_every", tr["check_every"], 1, 100_000, "check every 1..100000 rounds")
    _in("transport.rate_mbps", tr["rate_mbps"], 0, 10_000, "use 0 (link rate) or a rate in Mbit/s")
    _in("transport.round_deadline_s", tr["round_deadline_s"], 0.1, 3600,
        "use a deadline of 0.1..3600 s")

    _validate_bursts(data)

    for i, h in enumerate(cap["hosts"]):
        if not isinstance(h, str) or not re.match(r"^(server|worker\d+)$", h):
            raise SpecError(f"capture.hosts[{i}]", f"{h!r} is not a role",
                            "use 'server' or 'workerN'")
        if h.startswith("worker") and int(h[6:]) >= place["workers"]:
            raise SpecError(f"capture.hosts[{i}]", f"{h} does not exist",
                            f"use worker0..worker{place['workers'] - 1}")
    _in("capture.snaplen", cap["snaplen"], 64, 65535, "use a snap length of 64..65535 bytes")
    _in("limits.arm_timeout_s", data["limits"]["arm_timeout_s"], 1, 86_400,
        "use an arm timeout of 1..86400 s")
    return Spec(data)


def _validate_bursts(data: dict):
    """The bursts and the generator, by controllers.bursts; targets resolved as the controller will.

    Why resolve here: a target naming a worker the placement does not have,
    or a link the topology lacks, would otherwise fail only when the burst
    fires, in the middle of an arm.
    """
    try:
        every = BurstEvery(**data["burst_every"])
    except BurstError as exc:
        raise SpecError(exc.under("burst_every").field, exc.problem, exc.fix) from None
    try:
        bursts = spec_bursts(data["bursts"], data["training"]["rounds"])
    except BurstError as exc:
        raise SpecError(exc.field, exc.problem, exc.fix) from None
    from topologies import TOPOLOGIES  # a pure graph: no side effects
    workers = data["placement"]["workers"]
    graph = build_topology(data["topology"], TOPOLOGIES, workers)
    server, placed = graph.place(workers)
    roles = {"server": server, "workers": list(placed)}
    targets = [("burst_every.target", every.target)] + \
        [(f"bursts[{i}].target", b.target) for i, b in enumerate(bursts)]
    for field, target in targets:
        try:
            resolve_target(graph, target, roles)
        except TargetError as exc:
            raise SpecError(field, exc.problem, exc.fix) from None


def build_topology(topo: dict, registry, workers: int):
    """The spec's topology section as a pure graph (no root, no Mininet)."""
    kind = topo["kind"]
    if kind == "fattree":
        return registry[kind](k=topo["k"])
    if kind == "leafspine":
        return registry[kind](leaves=topo["leaves"], spines=topo["spines"],
                              hosts_per_leaf=topo["hosts_per_leaf"])
    return registry[kind](workers=workers)


def load(path: str | None, preset: dict | None = None, overrides: list[str] = ()) -> Spec:
    """Defaults, then the preset, then the file, then `--set` overrides."""
    data = defaults()
    if preset:
        data = merge(data, preset, origin="preset")
    if path:
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise SpecError("SPEC", f"file {path} not found", "give the path of a TOML spec")
        except tomllib.TOMLDecodeError as exc:
            raise SpecError("SPEC", f"{path} is not valid TOML ({exc})", "fix the TOML syntax")
        data = merge(data, doc)
    data = apply_overrides(data, list(overrides))
    return validate(data)


# -- a small TOML writer (tomllib only reads) --------------------------------

def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {v!r} as TOML")


def dumps_toml(data: dict) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in data[""].items()]
    for sec in SCHEMA:
        if sec:
            lines += ["", f"[{sec}]"] + [f"{k} = {_toml_value(v)}" for k, v in data[sec].items()]
    for b in data.get("bursts", []):
        lines += ["", "[[bursts]]"] + [f"{k} = {_toml_value(v)}" for k, v in b.items()]
    return "\n".join(lines) + "\n"
