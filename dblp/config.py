"""The transport's settings: one typed, validated, serializable home for every knob.

A setting crosses a process boundary only inside a ``TransportConfig`` written
as JSON (``write``/``read``), never as a command-line string parsed again, so
it has one type, one range (declared beside the field) and one default.
``from_env`` reads the same fields from ``DBLP_*`` variables for torchrun-style
launchers. The names a setting may take live in registries here (``CONTROLS``,
``MODES``, ``MISSING``, ``NORMS``, ``SIGNALS``, ``ORDERS``) and in
``dblp.policy.POLICIES``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from . import wire

#: Version of the JSON layout ``to_json`` writes; ``from_json`` refuses others.
SCHEMA = 1
#: The file name a launcher writes into a run directory (one per arm).
CONFIG_FILE = "transport.json"
#: Environment variable carrying the per-job secret (hex) for ``from_env``.
SECRET_ENV = "DBLP_SECRET"
#: Environment variable naming a config file ``from_env`` starts from.
CONFIG_ENV = "DBLP_CONFIG"
#: Environment variable that permits the test-only ``slowdown`` setting ("1").
#: Only the regression test sets it: a slowed transport must never be
#: mistaken for the real one in a result.
SLOWDOWN_ENV = "DBLP_TEST_SLOWDOWN"

CONTROLS = ("udp", "tcp")  # control path: UDP with own timers, or TCP (the paper's)
MODES = ("ps", "sharded")  # one parameter server, or every rank aggregates a shard
MISSING = ("zero", "mean", "error_feedback")  # what an aggregate does with missing chunks
NORMS = ("mean", "last")  # phase detection: mean norm over a check interval, or the last one
#: What the phase detector measures each round (``dblp.rounds.detector_norm``):
#: "rescaled" = the norm of the delivered contributions, rescaled to the whole
#: gradient (the transport's own drops cannot move it); "delivered" = the norm of
#: the applied aggregate after the missing chunks were filled (the old signal:
#: relaxing the bound lowers it by itself; kept for the ablation).
SIGNALS = ("rescaled", "delivered")
#: The order a sender's pass sends the chunks of a stream in
#: (``dblp.streams.stream_order``): "shuffled" = a per-round seeded
#: permutation, so an early stop drops a different subset every round;
#: "fixed" = index order every pass, the authors' prototype (an early stop
#: always drops the tail of the model).
ORDERS = ("shuffled", "fixed")

SECRET_BYTES = (16, 64)  # accepted secret sizes: 128 to 512 bits


#: The loss-bound policies by name. ``dblp.policy`` registers the built-in ones
#: (the package imports it), and a researcher's own is registered the same way
#: (``dblp.POLICIES["mine"] = MyBound``); kept here so the settings that name a
#: policy read it without importing the policies, which import these settings.
POLICIES: dict[str, type] = {}


def _choices(registry: str):
    """Late lookup of a registry, so user registrations after import are honoured."""
    return tuple(globals()[registry])


def _setting(default, kind: str, doc: str, *, lo=None, hi=None, lo_open=False, hi_open=False,
             choices: str | None = None, optional: bool = False, repr: bool = True,
             step: int | None = None) -> Any:
    """A dataclass field with its range (or registry of names) declared beside it.

    ``step``: an int setting must also be a multiple of it (whole float32s).
    """
    meta = {"kind": kind, "doc": doc, "lo": lo, "hi": hi, "lo_open": lo_open,
            "hi_open": hi_open, "choices": choices, "optional": optional, "step": step}
    return dataclasses.field(default=default, metadata=meta, repr=repr)


def _range_text(m: Mapping) -> str:
    lo = "(" if m["lo_open"] else "["
    hi = ")" if m["hi_open"] else "]"
    a = "-inf" if m["lo"] is None else f"{m['lo']!r}"
    b = "inf" if m["hi"] is None else f"{m['hi']!r}"
    return f"{lo}{a}, {b}{hi}"


def _check(name: str, value, m: Mapping):
    """Validate one value against its declaration; return it normalized (ints -> floats)."""
    kind = m["kind"]
    if value is None:
        if m["optional"]:
            return None
        raise ValueError(f"{name} must be set ({m['doc']})")
    if m["choices"] is not None:
        names = _choices(m["choices"])
        if value not in names:
            raise ValueError(f"{name} must be one of {list(names)}, got {value!r}")
        return value
    if kind == "hex":
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a hex string, got {type(value).__name__}")
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raise ValueError(f"{name} must be hex digits (e.g. secrets.token_hex(32)), "
                             "got non-hex characters") from None
        lo, hi = SECRET_BYTES
        if not lo <= len(raw) <= hi:
            raise ValueError(f"{name} must be {lo} to {hi} bytes ({2 * lo} to {2 * hi} hex "
                             f"digits), got {len(raw)} bytes; make one with "
                             "secrets.token_hex(32)")
        return raw.hex()
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value
    if kind == "int_or_epoch" and value == "epoch":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        want = "an int" if kind in ("int", "int_or_epoch") else "a number"
        extra = " or 'epoch'" if kind == "int_or_epoch" else ""
        raise ValueError(f"{name} must be {want}{extra} in {_range_text(m)}, got {value!r}")
    if kind in ("int", "int_or_epoch"):
        if isinstance(value, float):
            raise ValueError(f"{name} must be an int in {_range_text(m)}, got {value!r}")
    else:
        value = float(value)
        if math.isnan(value):
            raise ValueError(f"{name} must be a number in {_range_text(m)}, got nan")
    lo, hi = m["lo"], m["hi"]
    if (lo is not None and (value < lo or (m["lo_open"] and value == lo))) or \
            (hi is not None and (value > hi or (m["hi_open"] and value == hi))) or \
            (isinstance(value, float) and math.isinf(value)):
        raise ValueError(f"{name} must be in {_range_text(m)}, got {value!r}")
    if m.get("step") and value % m["step"]:
        raise ValueError(f"{name} must be a multiple of {m['step']} in {_range_text(m)}, "
                         f"got {value!r}")
    return value


def default_of(name: str):
    """The one default of setting ``name`` (policies use it for their keyword defaults)."""
    return TransportConfig.__dataclass_fields__[name].default


def check_setting(name: str, value):
    """Validate ``value`` for the setting ``name`` by its declaration in ``TransportConfig``.

    Policies call this for their knobs, so a knob built directly
    (``make_policy``) and one read from a config file share one range.
    """
    return _check(name, value, _FIELDS[name].metadata)


@dataclasses.dataclass(frozen=True)
class TransportConfig:
    """Every setting of one job's transport, validated once on construction.

    Build it with keywords (unknown names are a TypeError), from a file
    (``read``), from JSON (``from_json``) or from ``DBLP_*`` variables
    (``from_env``). ``dataclasses.replace(cfg, p=0.02)`` re-validates.

    Prototype mode: six settings reproduce the *costs* of the paper
    authors' prototype, one at a time, so an ablation can attribute a
    speedup to each; their defaults are this transport's own behaviour.
    ``chunk_bytes=8192`` sends 8 KB chunks the kernel IP-fragments (~6
    fragments at a 1500-byte MTU; losing any loses the chunk);
    ``chunk_order="fixed"`` sends chunks in index order every pass;
    ``probe_wait=1.0`` resends an unanswered PROBE after exactly one second
    on the UDP control path (with ``control="tcp"`` a PROBE is never resent
    by the transport, whatever ``probe_wait`` says: TCP retransmits the lost
    segment itself, with its own timer of at least 200 ms; FINAL, this
    transport's message for identical replicas, keeps its adaptive timer
    either way); ``nagle=True``
    leaves Nagle's algorithm on for the TCP control connections (no effect on
    the UDP control path); ``bucket_s=0.1`` makes the sender's token bucket
    refill in 100 ms steps and empty each step at once into socket buffers of
    Linux's stock default size, dropping what the full send buffer refuses
    (and losing what overflows a receiver's buffer); ``no_progress_probes=10``
    makes a sender whose receiver's bitmap did not change since its last
    resend probe again instead of resending, up to ten probe rounds in a row.
    """

    # -- loss-bound policy (only the aggregator's matters in PS mode) --------------------
    policy: str = _setting("dblp", "str", "loss-bound policy", choices="POLICIES")
    p: float = _setting(0.008, "float", "static bound P", lo=0.0, hi=1.0, hi_open=True)
    p_low: float = _setting(0.008, "float", "dblp: bound in critical phases", lo=0.0, hi=1.0,
                            hi_open=True)
    p_high: float | None = _setting(None, "float", "dblp: bound otherwise (None = p_low + 0.40)",
                                    lo=0.0, hi=1.0, hi_open=True, optional=True)
    threshold: float = _setting(0.5, "float", "dblp: relative norm change that means critical",
                                lo=0.0, lo_open=True)
    check_every: int | str = _setting(10, "int_or_epoch", "dblp: rounds between phase checks",
                                      lo=1)
    rounds_per_epoch: int | None = _setting(None, "int", "dblp: rounds of one epoch "
                                            "(needed by check_every='epoch')", lo=1, optional=True)
    norm: str = _setting("mean", "str", "dblp: norm compared at a check", choices="NORMS")
    # The library keeps the paper's signal (what its presets mirror and the CI
    # guard was measured with); the testbed's default preset uses "rescaled",
    # the one the transport's own drops cannot move (docs/results/detector.md).
    signal: str = _setting("delivered", "str", "dblp: what the phase detector measures per round",
                           choices="SIGNALS")
    # -- paths and aggregation ---------------------------------------------------------
    control: str = _setting("udp", "str", "control path", choices="CONTROLS")
    mode: str = _setting("ps", "str", "aggregation topology", choices="MODES")
    missing: str = _setting("zero", "str", "missing-chunk policy", choices="MISSING")
    # -- pacing and timers -------------------------------------------------------------
    rate_bps: float | None = _setting(None, "float", "pacing rate on the wire, bits/s "
                                      "(None = unpaced)", lo=0.0, lo_open=True, optional=True)
    round_timeout: float = _setting(30.0, "float", "seconds a round may take before PeerTimeout",
                                    lo=0.0, lo_open=True, hi=86400.0)
    join_timeout: float = _setting(120.0, "float", "seconds to wait for the job to assemble",
                                   lo=0.0, lo_open=True, hi=86400.0)
    idle_timeout: float = _setting(600.0, "float", "server: seconds to wait for a round's first "
                                   "message (workers compute in between)", lo=0.0, lo_open=True,
                                   hi=86400.0)
    hello_timeout: float = _setting(5.0, "float", "seconds a TCP control connection may stay "
                                    "without an authenticated HELLO", lo=0.0, lo_open=True,
                                    hi=3600.0)
    early_bytes: int = _setting(8 << 20, "int", "bytes of next-round messages buffered before "
                                "that round starts", lo=0, hi=1 << 30)
    # -- prototype mode: the authors' prototype's costs, one setting each (class docstring) --
    # MTU-sized chunks never fragment, so a lost packet costs one chunk; the
    # prototype's 8 KB chunks cost a whole chunk for any one of ~6 fragments.
    chunk_bytes: int = _setting(wire.CHUNK_BYTES, "int", "payload bytes of one data chunk "
                                f"(whole float32s; {wire.CHUNK_BYTES} = one unfragmented "
                                "datagram at a 1500-byte MTU; larger chunks are IP-fragmented, "
                                "the prototype's 8192)", lo=64, hi=wire.MAX_CHUNK_BYTES, step=4)
    # A per-round order spreads an early stop's drops over the whole model; the
    # prototype's fixed order always drops the tail.
    chunk_order: str = _setting("shuffled", "str", "order of the chunks in a sender's pass "
                                "(fixed = the prototype's index order)", choices="ORDERS")
    # The adaptive timer waits about one RTT plus variance before re-probing;
    # the prototype waits a fixed second. Only the UDP control path resends
    # probes: over TCP control the kernel retransmits them (class docstring).
    probe_wait: float | None = _setting(None, "float", "UDP control: seconds before an "
                                        "unanswered PROBE is resent (None = adaptive RTO with "
                                        "backoff; the prototype's 1.0); no effect with TCP "
                                        "control, which TCP retransmits itself",
                                        lo=0.0, lo_open=True, hi=3600.0, optional=True)
    # TCP_NODELAY sends each control message at once; with Nagle a small
    # message waits for the previous one's ACK (up to a delayed-ACK timeout).
    nagle: bool = _setting(False, "bool", "TCP control: leave Nagle's algorithm on (no "
                           "TCP_NODELAY), as the prototype did; no effect with UDP control")
    # The transport's bucket is 2 ms deep and refills continuously, into socket
    # buffers enlarged to hold a burst; the prototype's refilled every 100 ms and
    # emptied each refill at once into buffers of the kernel's default size, so
    # a share of every pass overflowed them before reaching the wire.
    bucket_s: float | None = _setting(None, "float", "the prototype's sender: the token bucket "
                                      "refills in whole steps of this many seconds of the "
                                      "pacing rate and releases each step's chunks at once, one "
                                      "datagram per call, into send and receive buffers of "
                                      "Linux's stock default size (212992 bytes); a datagram the "
                                      "full send buffer refuses is dropped, not retried (None = "
                                      "a continuous bucket of about 2 ms into the transport's "
                                      "enlarged buffers; the prototype's 0.1)",
                                      lo=0.0, lo_open=True, hi=10.0, optional=True)
    # The transport resends what every BITMAP lists; the prototype, seeing the
    # receiver's bitmap unchanged since its last resend, probed again instead,
    # up to ten probe rounds in a row, before resending.
    no_progress_probes: int = _setting(0, "int", "the prototype's no-progress rule: a sender "
                                       "whose receiver's bitmap is unchanged since its last "
                                       "resend probes again instead of resending, up to this "
                                       "many probe rounds in a row (0 = off: every BITMAP is "
                                       "answered with a resend; the prototype's 10)",
                                       lo=0, hi=1000)
    # -- the data path -----------------------------------------------------------------
    # One system call and one Python call per datagram cap the transport near
    # 1 Gbit/s on a small machine; batches move the same datagrams (dblp.batch).
    batched_io: bool = _setting(True, "bool", "move DATA datagrams in batches: UDP GSO messages "
                                "of up to 44 datagrams, up to 4 per call with the C core (0.5 ms "
                                "of the pacing rate in all) and recvmmsg "
                                "reads handled as arrays (with UDP receive offload where the C "
                                "core is built), the same bytes on the wire; false = "
                                "one system call per datagram")
    # -- test only ---------------------------------------------------------------------
    slowdown: float = _setting(0.0, "float", "test only: after each round a member waits this "
                               "fraction of the round's exchange time (0.1 = every exchange "
                               "10 % slower), so a test can show that the CI guard fails a "
                               "slower transport; refused unless DBLP_TEST_SLOWDOWN=1",
                               lo=0.0, hi=1.0)
    # -- identity of the job -----------------------------------------------------------
    session_id: int | None = _setting(None, "int", "64-bit job id (None = the aggregator "
                                      "draws one)", lo=1, hi=2**64 - 1, optional=True)
    stream: int = _setting(0, "int", "which of the jobs sharing one session and secret this is "
                           "(e.g. the torch backend's one stream per bucket size): part of "
                           "every MAC key, so no stream's datagram verifies in another",
                           lo=0, hi=2**32 - 1)
    secret: str | None = _setting(None, "hex", "per-job key (hex) that authenticates every "
                                  "message; None = unauthenticated", optional=True, repr=False)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = _check(f.name, getattr(self, f.name), f.metadata)
            object.__setattr__(self, f.name, v)
        if self.slowdown and os.environ.get(SLOWDOWN_ENV) != "1":
            raise ValueError(f"slowdown={self.slowdown} is a test-only setting (it slows the "
                             f"transport on purpose); set {SLOWDOWN_ENV}=1 to allow it, as the "
                             "CI regression test does")
        # Cross-field rules live with the policy (p_high >= p_low, epoch needs its
        # length): building it once here reports them before anything starts.
        self.make_policy()

    # -- what the settings build ------------------------------------------------------
    def make_policy(self):
        """A fresh policy object of ``policy`` with its knobs from this config."""
        cls = POLICIES[self.policy]
        return cls(**{k: getattr(self, k) for k in getattr(cls, "KNOBS", ())})

    def engine_options(self) -> dict:
        """The ``Engine`` keywords this config decides (one mapping for server and members)."""
        return {"control": self.control, "key": self.key, "early_bytes": self.early_bytes,
                "hello_timeout": self.hello_timeout, "chunk_bytes": self.chunk_bytes,
                "chunk_order": self.chunk_order, "probe_wait": self.probe_wait,
                "nagle": self.nagle, "bucket_s": self.bucket_s,
                "no_progress_probes": self.no_progress_probes, "batched_io": self.batched_io,
                "stream": self.stream}

    @property
    def key(self) -> bytes | None:
        """The secret as bytes (the MAC key), or None when unauthenticated."""
        return None if self.secret is None else bytes.fromhex(self.secret)

    def public_dict(self) -> dict:
        """The settings without the secret (for logs); ``authenticated`` says if one is set."""
        d = dataclasses.asdict(self)
        d["authenticated"] = d.pop("secret") is not None
        return d

    # -- serialization ------------------------------------------------------------------
    def to_json(self) -> str:
        """JSON with a ``schema`` version; ``from_json(to_json(c)) == c`` exactly."""
        return json.dumps({"schema": SCHEMA, **dataclasses.asdict(self)}, indent=1,
                          sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> TransportConfig:
        """Parse ``to_json``'s output; unknown schema versions and keys are refused."""
        try:
            doc = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"transport config is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError("transport config must be a JSON object")
        schema = doc.pop("schema", None)
        if schema != SCHEMA:
            raise ValueError(f"transport config schema {schema!r} is not supported "
                             f"(this dblp reads schema {SCHEMA})")
        unknown = sorted(set(doc) - set(_FIELDS))
        if unknown:
            raise ValueError(f"transport config has unknown settings {unknown}; "
                             f"known: {sorted(_FIELDS)}")
        return cls(**doc)

    def write(self, path: str | os.PathLike) -> None:
        """Write ``to_json()`` to ``path`` (mode 0600: it may hold the secret)."""
        path = os.fspath(path)
        tmp = f"{path}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.to_json() + "\n")
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: str | os.PathLike, env: Mapping[str, str] | None = None
             ) -> TransportConfig:
        """Read a file ``write`` made; a file without a secret takes ``$DBLP_SECRET``.

        The launcher may keep the key out of the run directory and hand it to
        each process in the environment instead; both set and different is an error.
        """
        try:
            with open(path, "rb") as fh:
                text = fh.read()
        except OSError as exc:
            raise ValueError(f"cannot read transport config {os.fspath(path)!r}: "
                             f"{exc.strerror}") from None
        try:
            cfg = cls.from_json(text)
        except ValueError as exc:
            raise ValueError(f"{os.fspath(path)}: {exc}") from None
        return cfg._with_env_secret(os.environ if env is None else env)

    def _with_env_secret(self, env: Mapping[str, str]) -> TransportConfig:
        s = env.get(SECRET_ENV)
        if not s:
            return self
        if self.secret is None:
            return dataclasses.replace(self, secret=s.strip().lower())
        if s.strip().lower() != self.secret:
            raise ValueError(f"${SECRET_ENV} differs from the secret in the transport config; "
                             "set only one of them")
        return self

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> TransportConfig:
        """Settings from ``$DBLP_CONFIG`` (a file), then ``DBLP_<FIELD>`` variables, then keywords.

        ``DBLP_SECRET`` carries the key (hex), e.g. ``DBLP_POLICY=static DBLP_P=0.02``;
        ``none`` clears an optional setting. A bad value names its variable.
        """
        env = os.environ if env is None else env
        base = cls.read(env[CONFIG_ENV], env) if env.get(CONFIG_ENV) else cls()
        values: dict = {}
        for name, f in _FIELDS.items():
            var = "DBLP_" + name.upper()
            if var not in env or name in overrides:
                continue
            try:
                values[name] = check_setting(name, _from_text(env[var], f.metadata))
            except ValueError as exc:
                raise ValueError(f"environment variable {var}={env[var]!r} is invalid: "
                                 f"{exc}") from None
        values.update(overrides)
        return dataclasses.replace(base, **values)


def merge(config: TransportConfig | None, settings: dict) -> tuple[TransportConfig, Any]:
    """``config`` (or the defaults) with keyword ``settings`` applied -> (config, policy).

    Lets ``ParameterServer``/``TransportGroup`` keep their keyword arguments
    without a second set of defaults. ``policy`` may be a policy object (anything
    with ``bound`` and ``observe``); it is used as is and its name recorded.
    """
    settings = dict(settings)
    policy_obj = None
    pol = settings.get("policy")
    if pol is not None and not isinstance(pol, str):
        if not (hasattr(pol, "bound") and hasattr(pol, "observe")):
            raise ValueError(f"policy must be one of {list(_choices('POLICIES'))} or a policy "
                             f"object, got {pol!r}")
        policy_obj = settings.pop("policy")
        if getattr(pol, "name", None) in _choices("POLICIES"):
            settings["policy"] = pol.name
    unknown = sorted(set(settings) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown transport setting(s) {unknown}; known: {sorted(_FIELDS)}")
    cfg = config if config is not None else TransportConfig()
    if not isinstance(cfg, TransportConfig):
        raise ValueError(f"config must be a TransportConfig, got {type(cfg).__name__}")
    if settings:
        cfg = dataclasses.replace(cfg, **settings)
    return cfg, (policy_obj if policy_obj is not None else cfg.make_policy())


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a valid setting value")


def _from_text(text: str, m: Mapping):
    """Convert an environment string by the field's declared kind."""
    t = text.strip()
    if m["optional"] and t.lower() in ("", "none"):
        return None
    kind = m["kind"]
    if kind == "float":
        return float(t)
    if kind == "bool":
        words = {"1": True, "true": True, "yes": True, "on": True,
                 "0": False, "false": False, "no": False, "off": False}
        if t.lower() not in words:
            raise ValueError(f"{t!r} is not true or false (1/0, true/false, yes/no, on/off)")
        return words[t.lower()]
    if kind == "int" or (kind == "int_or_epoch" and t != "epoch"):
        return int(t, 0)
    return t.lower() if kind == "hex" else t


_FIELDS = {f.name: f for f in dataclasses.fields(TransportConfig)}
SETTINGS = tuple(_FIELDS)  # every setting's name, in declaration order


_WARNED_OPEN: set[tuple[int, int]] = set()  # (process, rank) that said their job has no secret


def warn_unauthenticated(config: TransportConfig, rank: int, role: str) -> bool:
    """Say once per rank, at its start, that the job has no secret; True if it said so.

    Without one every tag is zeros and anyone who can reach the port may join
    or inject (a launcher such as torchrun sets no secret unless told to).
    """
    if config.secret is not None or (os.getpid(), rank) in _WARNED_OPEN:
        return False
    _WARNED_OPEN.add((os.getpid(), rank))
    logging.getLogger("dblp").warning(
        "%s rank %d: this job has no secret (set %s, or secret in the transport config): its "
        "messages are not authenticated, and anyone who can reach its port can join it or "
        "change its aggregate", role, rank, SECRET_ENV)
    return True
