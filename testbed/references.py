"""The references behind the measured tables: what each is, and its record.

Each `Reference` regenerates some tables (its page, docs/results/NAME.md, and
the README's headline) and names the folder of ``results/reference/`` that
keeps the small files they are rendered from. Its kinds, registered by class
as the topologies are (`REFERENCES` holds instances of the subclasses):

- `RunReference`: a `dblp-testbed run` of a preset (seeds, overrides); it
  keeps the run's derived tables (`KEPT_FILES`: summary, per-round and
  per-burst tables, evaluations, the resolved spec).
- `CommandReference`: one or more other `dblp-testbed` commands (a bench,
  a `net check` per fabric size or rate), each run with ``--json FILE``;
  it keeps those JSON files, each named after the command that wrote it.
- `StudyReference`: a declared study (`testbed.run.study`) run whole, of
  one of two kinds: `AblationReference`, a `dblp-testbed ablate`
  (`testbed.run.ablation`: one arm's setting varied over runs; it keeps the
  ablation's summary, per-point table, report and plots, not the runs' own
  tables), and `RegimeReference`, a `dblp-testbed regime` map
  (`testbed.run.regime`: the map's summary, tables, report and heat-maps).

Beside the kept files, ``reproduce.json`` (`RECORD_SCHEMA`) holds the
commands and their wall times.

Why here, beside the sub-packages rather than in one of them: the
declarations are read from both sides. `dblp-testbed reproduce`
(`testbed.run.reproduce`) makes each reference and keeps its files; the
tables of the README and of every page under docs/ are rendered from those
files (`testbed.analysis.pages`), which needs the references' names, order
and records but must not import the run. So this module declares, and
imports nothing that runs anything.
"""
from __future__ import annotations

import abc
import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import ClassVar

from testbed import REPO_ROOT
from testbed.errors import InputError

#: Where the committed reference data live.
REFERENCE_DIR = REPO_ROOT / "results" / "reference"
#: Where the pages of measured tables live: one page per reference (``NAME.md``).
RESULTS_PAGES = REPO_ROOT / "docs" / "results"


def pages(root: pathlib.Path = REPO_ROOT) -> list[pathlib.Path]:
    """The pages whose marked tables `reproduce` renders: the README and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]

#: The derived files kept per reference run: small, and enough to rebuild
#: every table of its page and to check each figure by hand.
KEPT_FILES = ("summary.json", "rounds.csv", "bursts.csv", "evals.csv", "spec.toml")
#: The file beside the kept ones that says how they were made.
RECORD = "reproduce.json"
#: Version of ``reproduce.json``: ``kind`` ("run" | "commands" | "ablation" | "regime"),
#: ``wall_s`` (the whole reference), and for a run or an ablation ``argv`` (the `dblp-testbed`
#: arguments, the run directory as DIR), for commands ``commands`` (one
#: ``{"file", "argv", "wall_s"}`` per command, ``--json`` naming the kept
#: file). Files written before the version existed (a run's ``argv`` and
#: ``wall_s`` only) read as version 1.
RECORD_SCHEMA = 1


class Reference(abc.ABC):
    """What regenerates some measured tables: its name, what it is and its commands.

    A subclass sets ``kind`` and says which `dblp-testbed` commands make it;
    `testbed.run.reproduce` makes it (one maker per subclass) and keeps its files.
    """

    kind: ClassVar[str]
    name: str
    doc: str

    @abc.abstractmethod
    def commands(self) -> list[list[str]]:
        """The `dblp-testbed` argument lists that regenerate it (output paths as placeholders)."""


@dataclasses.dataclass(frozen=True)
class RunReference(Reference):
    """A `dblp-testbed run` of a preset whose tables a results page shows.

    ``spec_file`` (a path in the repository) pins a reference made by an earlier
    version of its preset: the run starts from that resolved spec, which every field
    of the preset's current version gives way to, so the preset can move on while
    the reference stays reproducible.
    """

    kind: ClassVar[str] = "run"
    name: str
    preset: str
    doc: str
    overrides: tuple[str, ...] = ()
    spec_file: str = ""

    def argv(self, out: pathlib.Path) -> list[str]:
        """The `dblp-testbed run` arguments that regenerate it (also shown on the results pages)."""
        args = ["run", "--preset", self.preset, "--out", str(out)]
        if self.spec_file:
            args.insert(1, self.spec_file)
        for o in self.overrides:
            args += ["--set", o]
        return args

    def commands(self) -> list[list[str]]:
        return [self.argv(pathlib.Path("DIR"))]


@dataclasses.dataclass(frozen=True)
class Command:
    """One `dblp-testbed` command of a `CommandReference` and the JSON file it writes."""

    file: str
    argv: tuple[str, ...]

    def full_argv(self, json_path: str) -> list[str]:
        return [*self.argv, "--json", json_path]


@dataclasses.dataclass(frozen=True)
class CommandReference(Reference):
    """`dblp-testbed` commands run with ``--json FILE``, each file kept.

    ``runner(argv, log) -> exit code`` runs one command (None: a child
    `dblp-testbed`, `testbed.run.reproduce.run_cli`; tests pass a fake). A
    command that exits non-zero or writes no JSON fails the reference; the
    files the others wrote stay in the run directory.
    """

    kind: ClassVar[str] = "commands"
    name: str
    doc: str
    steps: tuple[Command, ...]
    runner: Callable[[list[str], pathlib.Path], int] | None = dataclasses.field(
        default=None, compare=False, repr=False)

    def __post_init__(self):
        files = [c.file for c in self.steps]
        if not files or len(set(files)) != len(files) or RECORD in files \
                or any(not f.endswith(".json") or "/" in f for f in files):
            raise ValueError(f"reference {self.name}: each command needs its own FILE.json")

    def files(self) -> tuple[str, ...]:
        """The JSON files its commands write, in their order."""
        return tuple(c.file for c in self.steps)

    def commands(self) -> list[list[str]]:
        return [c.full_argv(c.file) for c in self.steps]


@dataclasses.dataclass(frozen=True)
class StudyReference(Reference):
    """A declared study run whole (`testbed.run.study.Study`): its kind's command and files.

    A subclass names the command of its kind of study (``command``); the
    reference's ``study`` is a study of that kind by name.
    """

    command: ClassVar[str]
    name: str
    study: str
    doc: str
    #: ``run_fn(spec, out_dir) -> status`` for each run (None: a real run; tests pass a fake).
    run_fn: Callable | None = dataclasses.field(default=None, compare=False, repr=False)

    def commands(self) -> list[list[str]]:
        return [[self.command, self.study, "--out", "DIR"]]


@dataclasses.dataclass(frozen=True)
class AblationReference(StudyReference):
    """A `dblp-testbed ablate` of a declared ablation: its summary, table, report and plots."""

    kind: ClassVar[str] = "ablation"
    command: ClassVar[str] = "ablate"


@dataclasses.dataclass(frozen=True)
class RegimeReference(StudyReference):
    """A `dblp-testbed regime` map: its summary, tables, report and heat-maps."""

    kind: ClassVar[str] = "regime"
    command: ClassVar[str] = "regime"


REFERENCES: dict[str, Reference] = {}
#: Not a reference: blocks naming it are rendered from every reference.
EVERY = "all"


def register(ref: Reference) -> Reference:
    if ref.name == EVERY or (ref.name in REFERENCES and REFERENCES[ref.name] != ref):
        raise ValueError(f"reference {ref.name!r} is already registered")
    REFERENCES[ref.name] = ref
    return ref


register(RunReference("default", "default",
                      "what `dblp-testbed run` does with no argument: the like-for-like arms, "
                      "seeds and bursts of the default preset"))
register(RunReference("paper-regime", "paper-regime",
                      "the paper's training regime: a model trained to its plateau, the phase "
                      "checked per epoch with DBLP relaxed for most of training, bursts at the "
                      "paper's density, the paper's arms and the sharded ones, five seeds"))
# The regime's first version, 22 epochs (682 rounds) and two bursts, with each of the
# detector's norms. With the paper's zero-filled one a relaxed epoch's own drops lowered
# its norm past the threshold and sent DBLP back to critical in four seeds of five; with
# the drop-corrected one the sharded arms still lost epochs to it (their replicas lack
# the push counts), and 22 epochs left too little relaxed training either way
# (docs/results/paper-regime-delivered.md).
register(RunReference("paper-regime-delivered", "paper-regime",
                      "paper-regime's first version (22 epochs, two bursts) with the paper's "
                      "zero-filled detector norm, which a relaxed epoch's own drops lower",
                      spec_file="results/reference/paper-regime-delivered/spec.toml"))
register(RunReference("paper-regime-rescaled", "paper-regime",
                      "paper-regime's first version (22 epochs, two bursts) with the detector's "
                      "drop-corrected norm",
                      spec_file="results/reference/paper-regime-rescaled/spec.toml"))
register(RunReference("paper", "paper",
                      "the paper's star with the parameter server, both control paths, "
                      "five bursts at each of 60/70/80/90 %"))
# The prototype's costs but its 8 KB chunks: with them the run stopped at its
# first burst (a 1 s burst leaves the server's IP reassembly memory full of
# incomplete datagrams, and every fragmented one is dropped until they expire
# 30 s later, past the round deadline; docs/results/paper-prototype.md). The
# preset's later costs (the sender's bucket, the no-progress rule) are off too:
# the committed run predates them.
register(RunReference("paper-prototype", "paper-prototype",
                      "the paper preset with the authors' prototype's fixed chunk order, 1 s probe "
                      "wait and Nagle on TCP control (MTU-sized chunks)",
                      ("transport.chunk_bytes=1408", "transport.bucket_s=0",
                       "transport.no_progress_probes=0")))


@dataclasses.dataclass(frozen=True)
class CostStep:
    """One step of the prototype's costs added one at a time: a reference and what it adds."""

    reference: str
    adds: str


#: The prototype's last three costs added one at a time to `paper-prototype`
#: (each step keeps the ones before it). Each step is a run reference of its
#: own; the README's table of the ratio at each step
#: (`testbed.analysis.pages.every.prototype_costs_table`) reads their summaries.
#: The no-progress rule comes before 8 KB chunks: it is a setting of the
#: sender alone, while 8 KB chunks also need the fabric's raised reassembly
#: limits. The last step is the preset as it is. The bucket's step took 44
#: minutes here.
PROTOTYPE_COSTS = (
    CostStep("paper-prototype", "fixed chunk order, 1 s probe wait, Nagle on TCP control"),
    CostStep("paper-prototype-bucket", "+ the sender's 100 ms bucket into default-sized buffers"),
    CostStep("paper-prototype-noprogress",
             "+ no resend for up to 10 probe rounds without progress"),
    CostStep("paper-prototype-8k", "+ 8 KB chunks in six IP fragments, reassembly limits raised"),
)
register(RunReference("paper-prototype-bucket", "paper-prototype",
                      "paper-prototype plus the sender's 100 ms token bucket into default-sized "
                      "socket buffers (MTU-sized chunks)",
                      ("transport.chunk_bytes=1408", "transport.no_progress_probes=0")))
register(RunReference("paper-prototype-noprogress", "paper-prototype",
                      "paper-prototype-bucket plus the rule that re-probes instead of resending "
                      "for up to 10 probe rounds while the receiver's bitmap is unchanged "
                      "(MTU-sized chunks)",
                      ("transport.chunk_bytes=1408",)))
# Every cost: the preset as it is. `static`'s rounds took 9.7 s (median) here, the
# bucket's sender refused by default-sized buffers a datagram of six fragments at a
# time, so 80 rounds of one arm outlast the preset's 600 s arm limit.
register(RunReference("paper-prototype-8k", "paper-prototype",
                      "paper-prototype-noprogress with the prototype's 8 KB chunks, each six IP "
                      "fragments, the hosts' reassembly limits raised: the preset as it is",
                      ("limits.arm_timeout_s=3600",)))
register(RunReference("star", "star",
                      "the accuracy check: the paper's star without bursts, every transport arm, "
                      "400 rounds with the rate annealed, two seeds"))
# The transport bench with UDP control (TCP rows miss their deadlines for
# minutes at 50-80 % loss) and gloo beside it: gloo's two deadline misses at
# 50 and 80 % cost about a minute each, and its column is the like-for-like
# peer of the sharded rows.
register(CommandReference(
    "transport", "the transport benchmark: every bound, PS and sharded, UDP control, with and "
    "without a secret, and gloo's all-reduce, on a 100 Mbit/s veth pair at 0-80 % loss",
    (Command("bench-transport.json", ("bench", "transport", "--controls", "udp", "--reps", "3",
                                      "--losses", "0,0.1,0.5,0.8")),)))
#: The bench reference whose sustained-loss ratio the table of prototype costs quotes:
#: where the paper's 4.0-5.9x can come from, beside the costs that cannot give it.
SUSTAINED_LOSS = "transport-tcp"
# The same bench with TCP control, the prototype's control path, from 0 to 90 % loss,
# every row with a secret as every fabric run has. PS rows and gloo only: sharded mode's
# control is UDP. TCP's retransmission timeouts back off past 30 s from 50 % loss,
# so each round gets 60 s (a row gives up after two misses), and five repetitions,
# since one row's round trips spread by up to 4x with those timeouts (3.7-14.9 s for
# the 0.8 % bound at 30 %).
register(CommandReference(
    SUSTAINED_LOSS, "the transport benchmark with TCP control: every bound, PS mode, with a "
    "secret, and gloo's all-reduce, on a 100 Mbit/s veth pair at 0-90 % loss",
    (Command("bench-transport.json", ("bench", "transport", "--controls", "tcp", "--auth", "on",
                                      "--reps", "5", "--round-timeout", "60",
                                      "--losses", "0,0.1,0.3,0.5,0.8,0.9")),)))
#: Link rates (Mbit/s) and gradient sizes (MiB) of the line-rate bench: sizes that keep
#: a round trip above ~0.1 s; 100 Mbit/s is the transport reference's own rate. Medians
#: of 7: a round trip of 0.2-0.4 s varied by up to 25 % between repetitions here.
LINE_RATES = ((100, 4), (1000, 32), (3000, 32), (10000, 64))
#: Runs of the whole set, one after the other: the ratio of one run's medians moves by
#: a fifth or more between runs here (sharded / gloo at 10 Gbit/s: 1.19 to 1.44x in one
#: reference, 1.21 to 1.65x in another), so each line-rate claim is read from its range
#: over these runs, never from one.
LINE_RUNS = 5
#: With and without a secret: what authentication costs at each rate is read within a run.
register(CommandReference(
    "linerate", "the transport bench on faster links: reliable PS and sharded, UDP control, "
    f"with and without a secret, and gloo's all-reduce, at 0 and 10 % loss, from 0.1 to "
    f"10 Gbit/s, {LINE_RUNS} runs",
    tuple(Command(f"bench-transport-{r}mbit-run{i}.json",
                  ("bench", "transport", "--rate-mbit", str(r), "--mbytes", str(m),
                   "--losses", "0,0.1", "--controls", "udp", "--bounds", "0", "--auth", "both",
                   "--reps", "7", "--round-timeout", "60"))
          for i in range(1, LINE_RUNS + 1) for r, m in LINE_RATES)))
#: The paper's burst levels, each as a loss on the data path alone that lasts every pass
#: of the round: the regime where the bounds' pass-count ratio (5.0, 4.7, 4.4 and 5.1x at
#: 60-90 %) can show, with TCP control still moving.
BURST_LEVELS = (0.6, 0.7, 0.8, 0.9)
#: Runs of the whole set, one command each, so the ratio's interval has the run as its unit
#: (`testbed.analysis.pages.bound_ratio`); five give t(0.975, 4) = 2.78 where three give 4.30.
BURST_RUNS = 5
# One run: 2 bounds x 2 control paths x 2 costs = 8 PS rows with a secret (sharded mode and
# gloo add nothing here: sharded's control is UDP only, gloo's TCP meets no data-path loss),
# two round trips each at every level. At 100 Mbit/s a 4 MiB round trip's bytes take
# 0.336 s x 2(1 - P)/(1 - p) (push and pull, each pass resending what is missing): 22.2 s
# for the tight and the loose round trip of one (control, costs) pair over the four
# levels, 25.5 s at the
# transport reference's 1.1-1.15x of its bound, 102 s for the four pairs; each of the
# tight bound's 184 passes and the loose bound's 38 in that sum adds one control round trip
# (under a millisecond; up to a 40 ms delayed ACK with the prototype's Nagle: at most 9 s),
# and each round trip ~0.1 s of the driver's: ~114 s a repetition, ~250 s a run with the
# agents' start-up, ~21 minutes for five runs. A bigger gradient or a faster link would
# only scale the bytes (the ratio is dimensionless); 100 Mbit/s and 4 MiB are the
# `transport` references' own. Deadline: with the prototype's 1 s probe wait paid on every
# pass (it is paid only for an unanswered PROBE, which a data-path loss never leaves), the
# tight bound's round at 90 % would take 46 push + 46 pull passes, ~92 s, plus 6.7 s of
# bytes; 1000 s is ten times that, so no row should meet it, and one that does is reported
# as capped (a run that meets it twice in a row gives that row up and costs ~35 minutes
# more).
register(CommandReference(
    "burstround", "the round-long burst: the transport bench at the paper's 60/70/80/90 % loss "
    "on the data path only, lasting every pass, both bounds and control paths, PS mode with a "
    f"secret, this transport's costs and the prototype's, {BURST_RUNS} runs",
    tuple(Command(f"bench-transport-run{i}.json",
                  ("bench", "transport", "--losses", ",".join(f"{x:g}" for x in BURST_LEVELS),
                   "--loss-on", "data", "--bounds", "0.008,0.408", "--controls", "udp,tcp",
                   "--no-sharded", "--no-gloo", "--auth", "on", "--costs", "both",
                   "--rate-mbps", "100", "--mbytes", "4", "--reps", "2",
                   "--round-timeout", "1000"))
          for i in range(1, BURST_RUNS + 1))))
#: Runs of the fixed-cost variant below (the three took 0.9 minutes here).
FIXED_COST_RUNS = 3
# The same ratio where a pass can cost a fixed time: the loss also takes the control path,
# so a PROBE or its BITMAP can be lost, and the prototype's sender then waits its fixed 1 s
# before probing again. UDP control only: TCP's retransmission timeouts back off past 30 s
# from 50 % loss (`transport-tcp`). 60 % only, as the ceiling of what a round may pay: were
# every pass to wait (both messages arrive with probability (1 - p)^2 = 0.16 for one copy),
# a pass would cost ~5 s and the tight bound's round ~105 s; but a control message goes out
# in as many copies as the per-peer loss estimate asks (`dblp.engine`: the same in the
# prototype's mode), so one gets through far sooner: the three runs took 0.9 minutes in all
# (docs/results/burstround-control.md).
# Deadline 1000 s, ten times that ceiling.
register(CommandReference(
    "burstround-control", "the round-long burst where a pass costs a fixed time: the transport "
    "bench at 60 % loss on every datagram, data and UDP control alike, both bounds, PS mode with a "
    f"secret, this transport's costs and the prototype's (its 1 s probe wait), {FIXED_COST_RUNS} runs",
    tuple(Command(f"bench-transport-run{i}.json",
                  ("bench", "transport", "--losses", "0.6", "--loss-on", "all",
                   "--bounds", "0.008,0.408", "--controls", "udp", "--no-sharded", "--no-gloo",
                   "--auth", "on", "--costs", "both", "--rate-mbps", "100", "--mbytes", "4",
                   "--reps", "2", "--round-timeout", "1000"))
          for i in range(1, FIXED_COST_RUNS + 1))))
#: Link rates (Mbit/s) and gradient sizes (MiB) of the bound ratio at line rate.
BOUND_RATES = ((1000, 64), (1000, 256), (10000, 64), (10000, 256))
# The loose bound against the tight one above 100 Mbit/s (`linerate` runs the reliable bound
# alone): 0/30/60/90 % on the data path only, both control paths, PS with a secret, no
# gloo, one run of three round trips per rate and size. A row's round trips over the four
# losses move 0.992 x 14.9 + 0.592 x 14.9 = 23.6 gradients each way (sum of 1/(1 - p) over
# the losses); push and pull, both control paths, three repetitions: at 1 Gbit/s (1.15x the
# bound, as `linerate` measured with loss) ~3.4 min for 64 MiB and ~12.8 min for 256 MiB;
# at 10 Gbit/s a lossy row is CPU-bound (GRO off: 4.6x its bound at 10 % in `linerate`),
# ~1.4 and ~4.7 min at 4x its bound, ~1.9 and ~6.4 at 6x: 22-25 minutes in all, with the
# agents' start-up. One run, not several: a second would pass 40 minutes; the table gives
# each ratio's range at the repetitions' extremes. Deadline: the slowest round expected is
# the tight bound at 90 % with 256 MiB at 1 Gbit/s, 2.15 s x 19.8 x 1.15 = 49 s; 300 s is
# six times it.
register(CommandReference(
    "linerate-bounds", "the transport bench's tight bound against its loose one at 1 and "
    "10 Gbit/s with 64 and 256 MiB gradients, 0/30/60/90 % loss on the data path only, both "
    "control paths, PS mode with a secret",
    tuple(Command(f"bench-transport-{r}mbit-{m}mib.json",
                  ("bench", "transport", "--rate-mbps", str(r), "--mbytes", str(m),
                   "--losses", "0,0.3,0.6,0.9", "--loss-on", "data", "--bounds", "0.008,0.408",
                   "--controls", "udp,tcp", "--no-sharded", "--no-gloo", "--auth", "on",
                   "--reps", "3", "--round-timeout", "300"))
          for r, m in BOUND_RATES)))
# nccl-tests' size sweep (`bench collectives`): all_reduce, all_gather and reduce_scatter over
# DBLP's torch backend (sharded mode; reliable and the 40.8 % bound) beside gloo, 1 to 64 MiB
# doubling on a 1 Gbit/s veth pair, loss-free and at 10 % on every packet, five timed calls a
# row. ~5 minutes: a repetition over the 7 sizes and 3 collectives takes ~12 s loss-free
# (DBLP's all_gather moves 4x a ring's bytes, its reduce_scatter 2x) and ~17 s at 10 %;
# six calls a point (one warm-up), ~0.15 s of buffers and checks a call, the agents'
# start-up ~10 s. Each DBLP rank keeps every size's streams: ~1.9 GB at the end.
register(CommandReference(
    "collectives", "nccl-tests' size sweep of all_reduce, all_gather and reduce_scatter from "
    "1 to 64 MiB on a 1 Gbit/s veth pair: DBLP's torch backend, reliable and at a 40.8 % "
    "bound, beside gloo, without loss and at 10 % loss",
    (Command("bench-collectives.json", ("bench", "collectives", "--rate-mbps", "1000",
                                        "--begin", "1M", "--end", "64M", "--factor", "2",
                                        "--bounds", "0,0.408", "--losses", "0,0.1",
                                        "--reps", "5", "--warmup", "1",
                                        "--round-timeout", "60")),)))
#: The fat-tree sizes `net check` builds for its results page (k=8 routes in ~20 s).
FABRIC_KS = (4, 6, 8)
register(CommandReference(
    "fabric", "`net check` of the fat-tree at each size: start-up, reachability, core spread, "
    "one TCP flow", tuple(Command(f"net-check-k{k}.json", ("net", "check", "--k", str(k)))
                          for k in FABRIC_KS)))
#: Shaping rates (Mbit/s) and concurrent flows of the capacity table.
CAPACITY_RATES, CAPACITY_FLOWS = (20, 30, 40, 50, 60, 100), (1, 4)
register(CommandReference(
    "capacity", "cross-pod TCP goodput on the k=4 fat-tree at each shaping rate, one flow and "
    "four at once: where the emulator, not the link, sets the rate",
    tuple(Command(f"net-check-bw{b}-flows{f}.json",
                  ("net", "check", "--bw", str(b), "--flows", str(f)))
          for b in CAPACITY_RATES for f in CAPACITY_FLOWS)))
# The detector's ablation (testbed.run.ablation): about an hour.
register(AblationReference(
    "detector", "detector", "DBLP's P_high, phase threshold and detector signal, each varied "
    "alone on the paper's set-up over three seeds, against static and static-high"))
register(CommandReference(
    "bursts", "requested against measured burst loss and timing on the k=4 fat-tree",
    (Command("bench-bursts.json", ("bench", "bursts")),)))
# The reduced burst regime map (testbed.run.regime): at most 30 minutes.
register(RegimeReference(
    "regime", "reduced", "the reduced burst regime map: 90 % bursts of 200 ms and 1 s, "
    "round-locked 60 % ones, both control paths, the pull path and congestion, both bounds "
    "and gloo"))


def select(names: tuple[str, ...] | list[str]) -> list[Reference]:
    """The references called ``names`` (all when empty); an unknown name is an InputError."""
    if not names:
        return list(REFERENCES.values())
    unknown = [n for n in names if n not in REFERENCES]
    if unknown:
        raise InputError(f"unknown reference {unknown[0]!r}; choose from {', '.join(REFERENCES)}")
    return [REFERENCES[n] for n in names]


def read_record(ref_dir: pathlib.Path) -> dict:
    """A reference folder's reproduce.json; a missing file or an unknown version is an InputError."""
    path = ref_dir / RECORD
    if not path.is_file():
        raise InputError(f"{path} does not exist; run `dblp-testbed reproduce {ref_dir.name}`")
    rec = json.loads(path.read_text())
    if rec.get("schema", RECORD_SCHEMA) != RECORD_SCHEMA:
        raise InputError(f"{path} has schema {rec['schema']}; this version reads "
                         f"{RECORD_SCHEMA} only: run `dblp-testbed reproduce {ref_dir.name}`")
    return rec
