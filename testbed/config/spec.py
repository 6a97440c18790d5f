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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import tomli_w

from controllers.bursts import SPEC_KEYS, BurstError, BurstEvery, BurstSchedule, spec_bursts
from controllers.targets import TargetError, resolve_target
from testbed.config import armtables
from testbed.config.arms import ARMS
from testbed.config.armtables import COMMANDS, DDP
from testbed.config.fields import NAME_RE, NUMBER, SpecError, check_type
from testbed.config.servers import ServerError, parse_servers
from topologies import TOPOLOGIES  # pure graphs: no side effects
from topologies.placement import PlacementError, place_pods

# The workloads' registries, copied so the spec validates without importing
# torch (pinned against workloads.models and workloads.data by unit tests):
# model name -> (task, its per-worker batch size when training.batch_size is 0).
MODELS = {"digits_cnn": ("digits", 32), "digits_resnet": ("digits", 32),
          "transformer_lm": ("lm", 16), "byte_lm": ("lm", 16), "fmnist_mlp": ("fmnist", 32)}
LR_SCHEDULES = ("constant", "cosine")
#: Training examples of the digits task (1,797 minus the 20 % test split);
#: a worker's shard is this divided by the workers, rounded down.
DIGITS_TRAIN_EXAMPLES = 1437
#: Training examples of the Fashion-MNIST task (workloads.data.FMNIST_TRAIN_EXAMPLES).
FMNIST_TRAIN_EXAMPLES = 6000
#: A link must drain its full drop-tail queue within this long. dblp's
#: retransmission timer never waits longer than 1 s (its maximum RTO) and
#: TCP's minimum RTO is 200 ms: on a slower link a full queue holds a sender's
#: data past its own timer, every round pays spurious retransmissions, and
#: the run measures the emulated queue instead of the transport.
MAX_QUEUE_DRAIN_S = 1.0
MTU_BYTES = 1500
#: Most seeds one run repeats every arm over; a run is the arms' time times this.
MAX_SEEDS = 1000


@dataclasses.dataclass(frozen=True)
class Setting:
    """One spec field: its type, default and allowed values, and how to fix a bad one.

    Every range lives here, beside its field, and `validate` derives the
    checks from these declarations. A transport field names the
    ``dblp.TransportConfig`` setting it becomes (`transport`): its range is
    that setting's, declared once in ``dblp.config``.
    """

    type: Any
    default: Any
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    unset: Any = None          # a value outside the range meaning "not set here" (0: a default)
    choices: Callable[[], Sequence[str]] | None = None  # a registry, read when checking
    min_items: int = 0         # lists: at least this many, each listed once
    step: int = 1              # integers: lo, lo + step, ... (a fat-tree's k is even)
    pattern: re.Pattern | None = None
    noun: str = "value"        # what one of `choices` is called in an error ("arm", "model")
    transport: str | None = None
    fix: str = ""

    def check(self, field: str, value) -> None:
        if self.unset is not None and value == self.unset and type(value) is not bool:
            return
        if self.pattern is not None and not self.pattern.match(value):
            raise SpecError(field, f"{value!r} is not a plain name", self.fix)
        if isinstance(value, list):
            if len(value) < self.min_items:
                raise SpecError(field, "is empty", self.fix)
            if len(set(map(repr, value))) != len(value):
                raise SpecError(field, "a value is listed twice", "list each one once")
        if self.choices is not None:
            names = tuple(self.choices())
            for v in value if isinstance(value, list) else [value]:
                if v not in names:
                    raise SpecError(field, f"unknown {self.noun} {v!r}",
                                    f"choose from: {', '.join(names)}")
        if self.transport is not None:
            from dblp.config import check_setting
            try:
                check_setting(self.transport, value)
            except ValueError as exc:
                raise SpecError(field, str(exc),
                                self.fix or f"see dblp.TransportConfig.{self.transport}") from None
        if self.lo is not None or self.hi is not None:
            lo = -math.inf if self.lo is None else self.lo
            hi = math.inf if self.hi is None else self.hi
            _in(field, value, lo, hi, self.fix or f"use a value in {_range(self)}",
                self.lo_open, self.hi_open)
        if self.step != 1 and (value - (self.lo or 0)) % self.step:
            what = "an even number" if self.step == 2 and not (self.lo or 0) % 2 \
                else f"a step of {self.step} from {self.lo}"
            raise SpecError(field, f"{value!r} is not {what} in {self.lo}..{self.hi}", self.fix)


def _range(s: Setting) -> str:
    return f"{'(' if s.lo_open else '['}{s.lo}, {s.hi}{')' if s.hi_open else ']'}"




class TopologySettings(Mapping):
    """The ``[topology]`` section: its kind, each registered topology's knobs, the links.

    Read from ``topologies.TOPOLOGIES`` on every use, so a topology registered
    after this module was imported brings its fields with it; each knob's
    range is the class's own declaration (``TopoGraph.KNOBS``). The fields
    of every kind are accepted whichever kind is chosen, so a spec can switch
    kinds with one override.
    """

    LINKS = {
        # Also at least the rate that drains a full queue in MAX_QUEUE_DRAIN_S.
        "bw_mbps": Setting(NUMBER, 20.0, lo=0, hi=1000, lo_open=True,
                           fix="use a rate in (0, 1000] Mbit/s"),
        "queue_pkts": Setting(int, 100, lo=2, hi=1000, fix="use a queue of 2..1000 packets"),
    }

    def _settings(self) -> dict[str, Setting]:
        out = {"kind": Setting(str, "fattree", choices=lambda: TOPOLOGIES, noun="topology")}
        for cls in TOPOLOGIES.values():
            for name, knob in cls.KNOBS.items():
                out.setdefault(name, Setting(int, knob.default, lo=knob.lo, hi=knob.hi,
                                             step=knob.step, fix=knob.fix))
        return {**out, **self.LINKS}

    def __getitem__(self, key: str) -> Setting:
        return self._settings()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._settings())

    def __len__(self) -> int:
        return len(self._settings())


# The schema: section -> field -> Setting. Defaults here are the `default`
# preset's; presets override some of them. The "" section is the top level.
SCHEMA: dict[str, Mapping[str, Setting]] = {
    "": {
        "name": Setting(str, "default", pattern=NAME_RE,
                        fix="use letters, digits, '.', '_' or '-' (no spaces, slashes or shell "
                            "characters)"),
        "seed": Setting(int, 1, lo=0, hi=2**31 - 1, fix="use a seed between 0 and 2147483647"),
        # Every arm runs once per seed value: seed, seed+1, ..., seed+seeds-1 (Spec.seed_values).
        "seeds": Setting(int, 1, lo=1, hi=MAX_SEEDS,
                         fix=f"use 1..{MAX_SEEDS} seeds (every arm runs once per seed), "
                             "e.g. --seeds 5"),
        "arms": Setting(list, ["gloo", "static", "dblp"], choices=lambda: ARMS, min_items=1, noun="arm",
                        fix="list at least one arm (`dblp-testbed run --help` lists them)"),
        "description": Setting(str, ""),
    },
    "topology": TopologySettings(),
    "placement": {
        # Also at most the topology's hosts minus the server (checked with the topology).
        "workers": Setting(int, 4, lo=1, hi=64, fix="use 1..64 workers"),
    },
    "training": {
        "model": Setting(str, "digits_cnn", choices=lambda: MODELS, noun="model"),
        "rounds": Setting(int, 300, lo=1, hi=100_000, fix="use 1..100000 rounds"),
        # Also at most a worker's shard of the training set (checked with the workers).
        "batch_size": Setting(int, 0, lo=1, hi=4096, unset=0,
                              fix="use 0 (the model's default) or a batch of 1..4096"),
        "lr": Setting(NUMBER, 0.0, lo=0, hi=10, lo_open=True, unset=0,
                      fix="use 0 (the model's default) or a rate in (0, 10]"),
        # "cosine": decay to zero over the rounds.
        "lr_schedule": Setting(str, "constant", choices=lambda: LR_SCHEDULES, noun="schedule"),
        "eval_every": Setting(int, 50, lo=1, hi=100_000, fix="evaluate every 1..100000 rounds"),
        # Test accuracy whose first arrival times each arm ("time to accuracy");
        # 0: derived from the run (testbed.analysis.claims.target_metric).
        "target_accuracy": Setting(NUMBER, 0.0, lo=0, hi=1, unset=0,
                                   fix="use 0 (derive it from the run) or an accuracy in (0, 1]"),
    },
    "transport": {
        "missing": Setting(str, "zero", transport="missing"),
        "p_static": Setting(NUMBER, 0.008, transport="p", fix="use a loss bound in [0, 1)"),
        "p_low": Setting(NUMBER, 0.008, transport="p_low", fix="use a loss bound in [0, 1)"),
        "p_high": Setting(NUMBER, 0.408, transport="p_high",
                          fix="use a loss bound in [0, 1), at least p_low"),
        "threshold": Setting(NUMBER, 0.5, transport="threshold", fix="use a positive threshold"),
        # Rounds between phase checks, or "epoch": once per epoch, as the paper does.
        "check_every": Setting((int, str), 10, transport="check_every",
                               fix="check the phase every 1 or more rounds, or write \"epoch\""),
        # 0: not set; check_every = "epoch" needs it (steps of one worker's shard).
        "rounds_per_epoch": Setting(int, 0, unset=0, transport="rounds_per_epoch",
                                    fix="use 0 (not set) or the rounds of one epoch, 1 or more"),
        "norm": Setting(str, "mean", transport="norm",
                        fix="compare the mean norm over a check interval or the last one"),
        "signal": Setting(str, "delivered", transport="signal",
                          fix="use the drop-corrected signal, or the zero-filled one to ablate"),
        # 0: each sender paces at its fair share of the link (the runner's rule).
        "rate_mbps": Setting(NUMBER, 0.0, lo=0, hi=10_000, lo_open=True, unset=0,
                             fix="use 0 (the link's fair share) or a rate in (0, 10000] Mbit/s"),
        "round_deadline_s": Setting(NUMBER, 30.0, transport="round_timeout",
                                    fix="use a deadline in seconds, e.g. 30"),
        # Prototype mode (dblp.TransportConfig, "prototype mode"): the authors'
        # prototype's costs, one field each; the defaults are the transport's own.
        # 1408 = dblp.wire.CHUNK_BYTES (one unfragmented datagram), copied so the
        # schema needs no dblp import (pinned by a unit test).
        "chunk_bytes": Setting(int, 1408, transport="chunk_bytes",
                               fix="use whole float32s, e.g. 1408 (MTU-sized) or 8192 "
                                   "(the prototype's IP-fragmented chunks)"),
        "chunk_order": Setting(str, "shuffled", transport="chunk_order",
                               fix="use shuffled (a per-round order) or fixed (the prototype's)"),
        # 0: the adaptive probe timer (RTO from the measured RTT).
        "probe_wait": Setting(NUMBER, 0.0, unset=0, transport="probe_wait",
                              fix="use 0 (adaptive) or a fixed wait in seconds, e.g. 1.0"),
        "nagle": Setting(bool, False, transport="nagle",
                         fix="use false (TCP_NODELAY) or true (the prototype's Nagle)"),
        # 0: the transport's own sender (a continuous bucket into enlarged buffers).
        "bucket_s": Setting(NUMBER, 0.0, unset=0, transport="bucket_s",
                            fix="use 0 (the transport's sender) or the prototype's bucket "
                                "step in seconds, e.g. 0.1"),
        "no_progress_probes": Setting(int, 0, transport="no_progress_probes",
                                      fix="use 0 (always resend) or the prototype's 10 probe "
                                          "rounds"),
    },
    # The burst generator: its fields, defaults and ranges live in controllers.bursts
    # (BurstEvery validates them); here only their types, for reading TOML.
    "burst_every": {k: Setting(typ, default) for k, (typ, default) in BurstEvery.schema().items()},
    "capture": {
        "enabled": Setting(bool, True),
        # Roles; each must exist with the placement (checked with the workers).
        "hosts": Setting(list, ["server", "worker0"]),
        "snaplen": Setting(int, 96, lo=64, hi=65535, fix="use a snap length of 64..65535 bytes"),
    },
    "limits": {
        "arm_timeout_s": Setting(NUMBER, 600.0, lo=1, hi=86_400,
                                 fix="use an arm timeout of 1..86400 s"),
    },
    # The machines the fabric spans, this one ("local") first; each name's form and the
    # placement over them are testbed.emulation.cluster's (checked in _validate_cluster).
    "cluster": {
        "servers": Setting(list, ["local"], min_items=1,
                           fix='list "local" first, then one "[user@]host[:port]" per machine'),
        # ssh's own options for every connection to the others, e.g. ["-i", "/root/.ssh/lab"].
        "ssh_options": Setting(list, [], fix='list ssh options as strings, e.g. ["-i", "/root/.ssh/lab"]'),
    },
}


@dataclasses.dataclass(frozen=True)
class Spec:
    """A validated experiment: plain data, safe to write back as TOML.

    ``schedule`` is the run's bursts resolved once, when the spec was
    validated (``controllers.bursts.BurstSchedule.to_dict``): the generator
    (`[burst_every]`) and the explicit `[[bursts]]` as one explicit, seeded
    list every arm and seed meets. The run writes it as it is; nothing after
    loading resolves bursts again. None for a Spec built from data directly.
    """

    data: dict
    schedule: dict | None = dataclasses.field(default=None, compare=False)

    def __getitem__(self, section: str) -> dict:
        return self.data[section]

    @property
    def name(self) -> str:
        return self.data[""]["name"]

    @property
    def seed(self) -> int:
        return self.data[""]["seed"]

    @property
    def seeds(self) -> int:
        return self.data[""]["seeds"]

    @property
    def seed_values(self) -> list[int]:
        """The seeds every arm runs with: seed, seed+1, ..., seed+seeds-1.

        A seed sets the model's initialisation, the data shards and the batch
        order. The burst schedule is not among them: it is resolved once per
        run from `seed` alone, so every arm and every seed meets the same
        bursts (the treatment), and the seeds vary only the training.
        """
        return list(range(self.seed, self.seed + self.seeds))

    @property
    def arms(self) -> list[str]:
        return list(self.data[""]["arms"])

    @property
    def bursts(self) -> list[dict]:
        return list(self.data["bursts"])

    @property
    def commands(self) -> dict[str, dict]:
        """The spec's ``[commands.NAME]`` sections, as written (registered as arms)."""
        return dict(self.data.get("commands", {}))

    @property
    def ddp_backends(self) -> dict[str, dict]:
        """The spec's ``[ddp.NAME]`` sections, as written (registered as arms)."""
        return dict(self.data.get(DDP, {}))

    def to_toml(self) -> str:
        return dumps_toml(self.data)


def defaults() -> dict:
    data = {sec: {k: copy.deepcopy(v.default) for k, v in fields.items()}
            for sec, fields in SCHEMA.items()}
    data["bursts"] = []
    data[COMMANDS] = {}
    data[DDP] = {}
    return data


def merge(base: dict, doc: dict, origin: str = "spec") -> dict:
    """Merge a parsed TOML document over `base`, rejecting unknown fields."""
    out = copy.deepcopy(base)
    for key, value in doc.items():
        if key == "bursts":
            out["bursts"] = _bursts(value)
        elif key == COMMANDS:
            out[COMMANDS] = {**out.get(COMMANDS, {}), **armtables.commands(value)}
        elif key == DDP:
            out[DDP] = {**out.get(DDP, {}), **armtables.ddp_backends(value)}
        elif key in SCHEMA and key != "":
            if not isinstance(value, dict):
                raise SpecError(key, "expected a table", f"write it as [{key}]")
            for fkey, fval in value.items():
                if fkey not in SCHEMA[key]:
                    raise SpecError(f"{key}.{fkey}", "unknown field",
                                    f"remove it; known fields: {', '.join(SCHEMA[key])}")
                check_type(f"{key}.{fkey}", fval, SCHEMA[key][fkey].type)
                out[key][fkey] = fval
        elif key in SCHEMA[""]:
            check_type(key, value, SCHEMA[""][key].type)
            out[""][key] = value
        else:
            known = [k for k in SCHEMA if k] + list(SCHEMA[""]) + ["bursts", COMMANDS, DDP]
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
        if SCHEMA[section][field].type is list and isinstance(value, str):
            value = [v for v in value.split(",") if v]
        check_type(name, value, SCHEMA[section][field].type)
        out[section][field] = value
    return out


def _in(field, value, lo, hi, fix, lo_open=False, hi_open=False):
    bad = (value <= lo if lo_open else value < lo) or (value >= hi if hi_open else value > hi)
    if bad:
        lb = "(" if lo_open else "["
        hb = ")" if hi_open else "]"
        raise SpecError(field, f"{value!r} is out of range {lb}{lo}, {hi}{hb}", fix)


def validate(data: dict) -> Spec:
    """Check every value against its declaration, then the fields' consistency.

    The spec's command arms and DDP arms are registered first, so its ``arms``
    may name them.
    """
    armtables.register_commands(data.get(COMMANDS, {}))
    armtables.register_ddp_backends(data.get(DDP, {}))
    for section, settings in SCHEMA.items():
        for key, setting in settings.items():
            setting.check(f"{section}.{key}" if section else key, data[section][key])
    top = data[""]
    if top["seed"] + top["seeds"] - 1 > SCHEMA[""]["seed"].hi:
        raise SpecError("seeds", f"seed {top['seed']} + {top['seeds']} seeds runs past the "
                        f"largest seed {SCHEMA['']['seed'].hi:.0f}", "use a smaller seed or fewer seeds")
    topo, place, train = data["topology"], data["placement"], data["training"]
    cap = data["capture"]
    min_bw = topo["queue_pkts"] * MTU_BYTES * 8 / MAX_QUEUE_DRAIN_S / 1e6
    if topo["bw_mbps"] < min_bw:
        raise SpecError("topology.bw_mbps", f"{topo['bw_mbps']} Mbit/s takes longer than "
                        f"{MAX_QUEUE_DRAIN_S:g} s to drain a full {topo['queue_pkts']}-packet "
                        "queue, longer than the transports' retransmission timers",
                        f"use at least {min_bw:g} Mbit/s, or a shorter topology.queue_pkts")
    hosts = TOPOLOGIES[topo["kind"]].hosts_for(topo)
    if place["workers"] + 1 > hosts:
        raise SpecError("placement.workers", f"{place['workers']} workers + 1 server need "
                        f"{place['workers'] + 1} hosts but the topology has {hosts}",
                        "use fewer workers or a larger topology")
    task, default_batch = MODELS[train["model"]]
    batch = train["batch_size"] or default_batch
    examples = {"digits": DIGITS_TRAIN_EXAMPLES, "fmnist": FMNIST_TRAIN_EXAMPLES}.get(task)
    if examples and batch > examples // place["workers"]:
        shard = examples // place["workers"]
        raise SpecError("training.batch_size", f"a batch of {batch} is larger than a worker's "
                        f"shard ({examples} examples / {place['workers']} workers = "
                        f"{shard})", f"use a batch of at most {shard} or fewer workers")
    tr = data["transport"]
    if tr["check_every"] == "epoch" and examples and tr["rounds_per_epoch"]:
        steps = examples // place["workers"] // batch
        if tr["rounds_per_epoch"] != steps:
            raise SpecError("transport.rounds_per_epoch", f"{tr['rounds_per_epoch']} is not the "
                            f"workload's epoch ({examples} examples / {place['workers']} workers "
                            f"/ batch {batch} = {steps} rounds)",
                            f"set transport.rounds_per_epoch = {steps}")
    # The transport's cross-field rules (p_high >= p_low) are the policy's own.
    transport_config(data["transport"], ARMS["dblp"])

    every, bursts = _validate_bursts(data)
    schedule = BurstSchedule.resolve(bursts, every, data["training"]["rounds"], top["seed"])

    _validate_cluster(data)
    for i, h in enumerate(cap["hosts"]):
        if not isinstance(h, str) or not re.match(r"^(server|worker\d+)$", h):
            raise SpecError(f"capture.hosts[{i}]", f"{h!r} is not a role",
                            "use 'server' or 'workerN'")
        if h.startswith("worker") and int(h[6:]) >= place["workers"]:
            raise SpecError(f"capture.hosts[{i}]", f"{h} does not exist",
                            f"use worker0..worker{place['workers'] - 1}")
    return Spec(data, schedule.to_dict())


def transport_config(transport: dict, arm, rate_bps: float | None = None):
    """The spec's transport section as the ``dblp.TransportConfig`` one arm's processes read.

    The one mapping from spec fields to transport settings (each field's
    ``Setting.transport``); the runner writes the result into the run
    directory. A value the transport refuses is a `SpecError` naming the
    spec field.
    """
    from dblp.config import TransportConfig, default_of

    fields = {s.transport: key for key, s in SCHEMA["transport"].items() if s.transport}
    # A field's "not set" value (its `unset`) is the transport's None.
    settings = {name: _unset_as_none(transport[key], SCHEMA["transport"][key])
                for name, key in fields.items()}
    # A round may legitimately take as long as the deadline; joining must not time out first.
    settings["join_timeout"] = max(default_of("join_timeout"), settings["round_timeout"])
    if arm.bound_from is not None:
        # The arm runs its fixed bound at another of the spec's bounds (static-high: p_high).
        if arm.bound_from not in transport:
            raise SpecError("arms", f"arm {arm.name!r} takes its bound from "
                            f"transport.{arm.bound_from}, which the spec does not have",
                            f"use one of: {', '.join(SCHEMA['transport'])}")
        settings["p"] = transport[arm.bound_from]
        fields["p"] = arm.bound_from
    if arm.slowdown:
        settings["slowdown"] = arm.slowdown
        fields["slowdown"] = "arms"
    try:
        return TransportConfig(policy=arm.transport, control=arm.control, mode=arm.mode,
                               rate_bps=rate_bps, **settings)
    except ValueError as exc:
        # dblp's messages start with the setting they are about.
        key = fields.get(str(exc).split(" ", 1)[0].split("=", 1)[0], "")
        if key == "arms":  # the arm's own setting, not a spec field
            raise SpecError("arms", f"arm {arm.name!r}: {exc}",
                            "leave the arm out of the run") from None
        raise SpecError(f"transport.{key}" if key else "transport", str(exc),
                        "see dblp.TransportConfig for each setting's range") from None


def _unset_as_none(value, setting: Setting):
    return None if setting.unset is not None and value == setting.unset else value


def _validate_bursts(data: dict) -> tuple[BurstEvery, list]:
    """The generator and the bursts, by controllers.bursts; targets resolved as the controller will.

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
    return every, bursts


def _validate_cluster(data: dict) -> None:
    """Each server name, the ssh options, and the topology's pods over the servers.

    Bursts need no check here: the controller reaches every server's ports
    (testbed.emulation.cluster: an nft agent on each, cross traffic through ssh). The
    names are `testbed.config.servers`'s, the pods over them `topologies.placement`'s.
    """
    try:
        servers = parse_servers(data["cluster"]["servers"])
    except ServerError as exc:
        raise SpecError(f"cluster.servers[{exc.index}]", exc.problem, exc.fix) from None
    options = data["cluster"]["ssh_options"]
    if not all(isinstance(o, str) and o and "\n" not in o for o in options):
        raise SpecError("cluster.ssh_options", f"{options!r} holds something other than one-line strings",
                        'list ssh options as strings, e.g. ["-i", "/root/.ssh/lab"]')
    if len(servers) == 1:
        return
    graph = build_topology(data["topology"], TOPOLOGIES, data["placement"]["workers"])
    try:
        place_pods(graph, [s.name for s in servers])
    except PlacementError as exc:
        raise SpecError("cluster.servers", str(exc), "use fewer servers or a topology with "
                        "more pods (a larger topology.k)") from None


def build_topology(topo: dict, registry, workers: int):
    """The spec's topology section as a pure graph (no root, no Mininet): the kind's `from_spec`."""
    return registry[topo["kind"]].from_spec(topo, workers)


def load(path: str | None, preset: dict | None = None, overrides: list[str] = ()) -> Spec:
    """Defaults, then the preset, then the file, then `--set` overrides."""
    data = defaults()
    if preset:
        data = merge(data, preset, origin="preset")
    if path:
        data = merge(data, _read_toml(path))
    data = apply_overrides(data, list(overrides))
    return validate(data)


def _read_toml(path: str) -> dict:
    """The spec file's TOML document; any unreadable file is a `SpecError`."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise SpecError("SPEC", f"file {path} not found", "give the path of a TOML spec") from None
    except OSError as exc:
        raise SpecError("SPEC", f"cannot read {path} ({exc.strerror})",
                        "give the path of a readable TOML file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError("SPEC", f"{path} is not UTF-8 text (byte {exc.start} is "
                        f"{raw[exc.start:exc.start + 1]!r})", "give a TOML text file") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError("SPEC", f"{path} is not valid TOML ({exc})", "fix the TOML syntax") from None


def dumps_toml(data: dict) -> str:
    """The resolved spec as TOML that `tomllib` reads back to the same data.

    Written by tomli-w, so any string (control characters, newlines, quotes)
    and any key is escaped as TOML requires.
    """
    doc = dict(data[""])
    doc.update({sec: data[sec] for sec in SCHEMA if sec})
    doc["bursts"] = data.get("bursts", [])
    if data.get(COMMANDS):
        doc[COMMANDS] = data[COMMANDS]
    if data.get(DDP):
        doc[DDP] = data[DDP]
    return tomli_w.dumps(doc)
