"""The registry of arms: every name an experiment can compare, and what each one runs.

An arm is a transport run one way: the dblp transport's loss-bound policy
(``dblp.policy.POLICIES``) with a control path and an aggregation mode
(``dblp.config.CONTROLS``, ``MODES``), or a baseline that does not use dblp
(``workloads.exchange.BASELINES``). Which transports exist is the workers'
list (``workloads.exchange.transports``), the one the worker and the server
take as ``--arm``; the names of policies, control paths and modes are
the transport's own registries, looked up when an arm is checked, so a policy a
researcher registers in ``dblp.policy.POLICIES`` can be run here as soon as an
arm names it::

    from testbed.config.arms import Arm, register
    register(Arm("mine", transport="mine", control="udp", mode="ps"))

Everything in the harness that needs to know what an arm is (the spec's
``arms`` list, the command line, the runner, the analysis) asks this module,
never a tuple of names of its own.

A *command arm* runs a user's own transport: a command the harness starts
on the emulated hosts (every worker and, when it has one, a server), under
the contract of docs/commands.md (``testbed.run.command`` declares it). A
spec declares it in its ``[commands.NAME]`` section and the spec loader
registers it here (`register_command`) before the spec's arms are checked,
so the runner, the analysis and the verdicts find it as they find a
built-in arm.

An arm's *integration* (``workloads.integrations.INTEGRATIONS``) is how its
workers' training loop hands the gradient to the transport: ``flat`` (one
flat exchange after backward) or ``ddp`` (an unmodified
DistributedDataParallel over ``init_process_group(BACKEND)``), and a ``ddp``
arm's *backend* (`Arm.backend`) is that torch.distributed backend, a
property of the arm that the launcher hands its workers (``--backend``):

* ``ddp``: the dblp policy the way ``dblp-sharded`` runs it (UDP control,
  sharded mode: the only way the torch backend runs) over the ``dblp``
  backend, so its rounds compare with ``dblp-sharded``'s and every table,
  interval and verdict of a dblp arm applies to it (its static partner is
  ``static-sharded``). There is no ``ddp-sharded``: the backend has no
  other mode, so ``ddp`` is the sharded one.
* ``ddp-gloo``: the ``gloo`` transport over gloo's backend, what a PyTorch
  user runs today: ``ddp``'s like-for-like baseline (`Arm.gloo_peer`), as
  ``gloo`` (one flat all-reduce after backward) is the flat arms'.
* a spec's ``[ddp.NAME]`` section (`register_ddp_backend`): transport
  ``c10d`` (``workloads.exchange.C10D``) over the c10d backend it names,
  registered by a module the workers import first, so a researcher's own
  torch.distributed backend runs unmodified DDP beside the others.
"""
from __future__ import annotations

import dataclasses

from workloads import exchange, integrations

#: Transports the workloads run without dblp (``workloads.exchange.BASELINES``):
#: "local" trains each worker on its own shard with no exchange (the
#: compute-only bound); "gloo" is torch.distributed's all-reduce over TCP (what
#: PyTorch users run today).
BASELINE_TRANSPORTS = tuple(exchange.BASELINES)
#: The mode in which every rank aggregates a shard and no server runs.
SHARDED = "sharded"
#: The one dblp policy whose bound is always zero (every chunk must arrive).
RELIABLE = "reliable"
#: The transport of every command arm: a user's own command (`Command`).
COMMAND = "command"
#: The transport of an arm over a c10d backend the arm names (`register_ddp_backend`).
C10D = exchange.C10D


def policies() -> tuple[str, ...]:
    """The dblp transport's loss-bound policies, read late so registrations count."""
    return exchange.dblp_transports()


def controls() -> tuple[str, ...]:
    from dblp.config import CONTROLS
    return tuple(CONTROLS)


def modes() -> tuple[str, ...]:
    from dblp.config import MODES
    return tuple(MODES)


def missing_policies() -> tuple[str, ...]:
    """What an aggregate may do with chunks that never arrived."""
    from dblp.config import MISSING
    return tuple(MISSING)


def transports() -> tuple[str, ...]:
    """Every transport an arm may run: the baselines, then dblp's policies (the workers' list)."""
    return exchange.transports()


@dataclasses.dataclass(frozen=True)
class Command:
    """What a command arm runs: argument lists (never a shell), as its spec section wrote them.

    ``worker`` runs once per worker rank; ``server`` (optional) once on the
    aggregation server's host, and without one rank 0 takes the server's
    host, as gloo's does. ``silence_s``: how long a worker may write nothing
    to its log before the unit fails, naming the last line it wrote.
    """

    worker: tuple[str, ...]
    server: tuple[str, ...] | None = None
    silence_s: float = 60.0

    def __post_init__(self):
        for role, argv in (("worker", self.worker), ("server", self.server)):
            if argv is None and role == "server":
                continue
            if not isinstance(argv, tuple) or not argv or \
                    not all(isinstance(a, str) and a for a in argv):
                raise ValueError(f"{role} must be a non-empty list of non-empty strings")
        if not 0 < self.silence_s <= 86_400:
            raise ValueError(f"silence_s {self.silence_s!r} is not in (0, 86400] seconds")


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: a name, the transport it runs and, for dblp, its control path and mode.

    ``bound_from`` names the spec's transport field whose value becomes the
    policy's fixed bound ``p`` (None: the spec's own ``p_static``). It lets one
    policy run at several of the spec's bounds without a special case in the
    runner: ``static-high`` is the static policy at the spec's ``p_high``, the
    bound DBLP relaxes to, so static-high vs static shows what the loose bound
    buys and dblp vs static-high what phase-awareness buys.

    ``slowdown`` (test only, ``dblp.TransportConfig.slowdown``): every
    exchange made that fraction longer on purpose. ``dblp-slowed`` is DBLP
    10 % slower, the twin the CI regression test runs beside ``dblp`` to show
    that `compare` fails it; the transport refuses it outside that test.

    ``command``: set for a command arm (transport ``COMMAND``), what it runs.

    ``integration``: how the workers' loop reaches the transport
    (``workloads.integrations``); the integration refuses a transport it
    cannot carry (``ddp``: the dblp policies with UDP control in sharded
    mode, gloo, or the ``c10d`` transport).

    ``backend``: under ``ddp``, the torch.distributed backend DDP runs over;
    left out, the transport's own (``dblp`` for its policies, ``gloo`` for
    gloo), filled in when the arm is made, so the registry always says it.
    ``backend_module``: for a ``c10d`` arm, the module its workers import
    before ``init_process_group`` (it registers the backend); None for a
    backend torch already knows.
    """

    name: str
    transport: str
    control: str | None = None
    mode: str | None = None
    bound_from: str | None = None
    slowdown: float = 0.0
    command: Command | None = None
    integration: str = integrations.FLAT
    backend: str | None = None
    backend_module: str | None = None

    def __post_init__(self):
        if not self.name or not all(c.isalnum() or c in "._-" for c in self.name):
            raise ValueError(f"arm name {self.name!r} must be letters, digits, '.', '_' or '-'")
        if (self.transport == COMMAND) != (self.command is not None):
            raise ValueError(f"arm {self.name!r}: a command arm has transport {COMMAND!r} and "
                             "a command; no other arm has either")
        if self.command is not None:
            if (self.control, self.mode, self.bound_from, self.slowdown, self.integration,
                    self.backend, self.backend_module) != \
                    (None, None, None, 0.0, integrations.FLAT, None, None):
                raise ValueError(f"arm {self.name!r}: a command arm has no control path, mode, "
                                 "bound, slowdown, integration or backend")
            return
        if self.transport not in transports():
            raise ValueError(f"arm {self.name!r}: transport {self.transport!r} is not one of "
                             f"{list(transports())}")
        if self.uses_dblp:
            if self.control not in controls():
                raise ValueError(f"arm {self.name!r}: control {self.control!r} is not one of "
                                 f"{list(controls())}")
            if self.mode not in modes():
                raise ValueError(f"arm {self.name!r}: mode {self.mode!r} is not one of "
                                 f"{list(modes())}")
        elif self.control is not None or self.mode is not None:
            raise ValueError(f"arm {self.name!r}: {self.transport} has no control path or mode")
        if self.backend is None:   # frozen: the one field filled in, from the arm's own
            object.__setattr__(self, "backend",
                               integrations.default_backend(self.integration, self.transport))
        if self.bound_from is not None and "p" not in _knobs(self.transport):
            raise ValueError(f"arm {self.name!r}: policy {self.transport!r} takes no fixed "
                             "bound p, so bound_from means nothing")
        if self.slowdown and not self.uses_dblp:
            raise ValueError(f"arm {self.name!r}: only a dblp arm can be slowed on purpose")
        why = integrations.refusal(self.integration, self.transport, self.control, self.mode,
                                   self.backend, self.backend_module)
        if why:
            raise ValueError(f"arm {self.name!r}: {why}")

    @property
    def uses_dblp(self) -> bool:
        """Carried by the dblp transport (its policy decides each round's bound)."""
        return self.transport in policies()

    @property
    def bounded(self) -> bool:
        """May end a round before every chunk arrived (a dblp policy other than reliable)."""
        return self.uses_dblp and self.transport != RELIABLE

    @property
    def serverless(self) -> bool:
        """No aggregation server: gloo, local, the sharded dblp arms and commands without one."""
        if self.command is not None:
            return self.command.server is None
        return not self.uses_dblp or self.mode == SHARDED

    @property
    def worker_args(self) -> list[str]:
        """The worker's flags for this arm's integration and backend (none for the flat loop)."""
        return integrations.integration_argv(self.integration, self.backend, self.backend_module)

    def gloo_peer(self) -> Arm | None:
        """The registered gloo arm reached the same way (same integration): what a PyTorch
        user would run instead, like for like. ``gloo`` for a flat arm (one all-reduce after
        backward, nothing overlapped), ``ddp-gloo`` for a DDP arm (DDP's buckets over gloo,
        overlapped with backward); None for a gloo arm itself and for a command arm."""
        if self.transport == "gloo" or self.command is not None:
            return None
        for arm in ARMS.values():
            if arm.transport == "gloo" and arm.integration == self.integration:
                return arm
        return None

    def peer(self, transport: str, bound_from: str | None = None) -> Arm | None:
        """The registered arm running ``transport`` the same way (same control, mode, integration).

        The analysis compares a dblp arm with the static arm of its own
        control path and mode (at the spec's p_static, or with
        ``bound_from="p_high"`` at DBLP's relaxed bound); this finds it without
        renaming strings.
        """
        for arm in ARMS.values():
            if (arm.transport, arm.control, arm.mode, arm.bound_from, arm.slowdown,
                    arm.integration) == (transport, self.control, self.mode, bound_from, 0.0,
                                         self.integration):
                return arm
        return None


ARMS: dict[str, Arm] = {}


def register(arm: Arm) -> Arm:
    """Add ``arm`` to the registry; a different arm under a taken name is refused."""
    old = ARMS.get(arm.name)
    if old is not None and old != arm:
        raise ValueError(f"arm {arm.name!r} is already registered as {old}")
    ARMS[arm.name] = arm
    return arm


def get(name: str) -> Arm:
    """The arm called ``name``; a KeyError lists the known ones."""
    try:
        return ARMS[name]
    except KeyError:
        raise KeyError(f"unknown arm {name!r}; known: {', '.join(ARMS)}") from None


def register_command(name: str, command: Command) -> Arm:
    """Register (or redefine) the command arm ``name``; a built-in arm's name is refused.

    Redefining is allowed because a spec owns its command arms: loading a
    spec again, or another spec with the same name, replaces the command
    (one process may load several specs: the tests, `report` on two runs).
    """
    old = ARMS.get(name)
    if old is not None and old.command is None:
        raise ValueError(f"arm {name!r} is a built-in arm; give the command arm another name")
    arm = Arm(name, COMMAND, command=command)
    ARMS[name] = arm
    return arm


def register_ddp_backend(name: str, backend: str, module: str | None = None) -> Arm:
    """Register (or redefine) ``name``: unmodified DDP over the c10d backend ``backend``.

    Its workers import ``module`` first (None: a backend torch knows), which
    registers the backend; the transport is ``c10d``. A built-in arm's name
    or a command arm's is refused; redefining one of these is allowed, as a
    spec owns them (see `register_command`).
    """
    old = ARMS.get(name)
    if old is not None and old.transport != C10D:
        kind = "a command arm" if old.command is not None else "a built-in arm"
        raise ValueError(f"arm {name!r} is {kind}; give the DDP arm another name")
    arm = Arm(name, C10D, integration=integrations.DDP, backend=backend, backend_module=module)
    ARMS[name] = arm
    return arm


def _knobs(transport: str) -> tuple[str, ...]:
    from dblp.policy import POLICIES
    return tuple(getattr(POLICIES.get(transport), "KNOBS", ()))


def register_policy(policy: str) -> list[Arm]:
    """The three arms of a dblp policy: UDP control, TCP control (the paper's) and sharded.

    A policy added to ``dblp.policy.POLICIES`` after this module was imported
    gets its arms with one call.
    """
    return [register(_policy_arm(policy, way)) for way in _POLICY_ARMS]


def _policy_arm(policy: str, way: tuple[str, str, str], name: str | None = None,
                bound_from: str | None = None) -> Arm:
    control, mode, suffix = way
    return Arm((name or policy) + suffix, policy, control, mode, bound_from)


# "ps": the workers push to an aggregation server and pull the average back
# (the paper's design); "sharded": no server, each worker aggregates 1/N of the
# gradient, the like-for-like peer of gloo's all-reduce (every link carries a
# share, no link carries everything).
_POLICY_ARMS = (("udp", "ps", ""), ("tcp", "ps", "-tcp"), ("udp", SHARDED, "-sharded"))
for _transport in BASELINE_TRANSPORTS:
    register(Arm(_transport, _transport))
for _way in _POLICY_ARMS:  # listed by control path and mode, as the README lists them
    for _policy in policies():
        register(_policy_arm(_policy, _way))
#: The static policy at DBLP's relaxed bound (the spec's p_high), for each way.
STATIC_HIGH = "static-high"
for _way in _POLICY_ARMS:
    register(_policy_arm("static", _way, STATIC_HIGH, bound_from="p_high"))
#: DBLP made 10 % slower on purpose (``Arm.slowdown``): the CI guard's twin.
SLOWED = "dblp-slowed"
#: How much slower the twin is: the regression the CI guard must catch.
SLOWED_BY = 0.10
register(Arm(SLOWED, "dblp", "udp", "ps", slowdown=SLOWED_BY))
#: DBLP under unmodified DistributedDataParallel: dblp-sharded reached through torch's DDP.
DDP = "ddp"
register(Arm(DDP, "dblp", "udp", SHARDED, integration=integrations.DDP))
#: gloo under unmodified DistributedDataParallel: ddp's like-for-like baseline.
DDP_GLOO = "ddp-gloo"
register(Arm(DDP_GLOO, "gloo", integration=integrations.DDP))
