"""The pipeline's first stage: a run directory's raw files, read and checked once.

A run trains every arm once per seed; one arm with one seed is a unit, whose
logs are under RUN/raw/<arm>/seed-<seed>/ (`testbed.rundir`). `load_raw`
reads them with RUN/spec.toml, RUN/manifest.json and the burst schedule the
run recorded, into one `RawRun` that every later stage takes as it is: the
tables (`testbed.analysis.tables`) never open a log again. Every line is
checked against `workloads.runlog.EVENTS`; a line that is not one is
skipped and said (`RawRun.problems`), so a crashed process costs only its
own last line.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

from controllers.bursts import BurstSchedule
from testbed.config import spec as specmod
from testbed.errors import InputError
from testbed.rundir import read_burst_schedule, read_manifest, unit_dir, unit_records
from workloads.runlog import MalformedEvent, check_event, seed_of_dir


class RawError(InputError):
    """RUN/ is not a run directory this version can read; the message says which file."""


@dataclasses.dataclass
class RawRun:
    """Everything read from a run directory, grouped by arm, plus what could not be read.

    Each event dict carries ``seed``, its unit's seed (the directory it was
    read from), so one arm's list holds all its seeds; `unit_events` picks
    one unit's.
    """

    run_dir: pathlib.Path
    arms: list[str]
    events: dict[str, list[dict]]          # arm -> worker/server events, every seed
    bursts: dict[str, list[dict]]          # arm -> burst events, every seed
    spec: specmod.Spec
    manifest: dict
    problems: list[str]
    queue: dict[str, list[dict]] = dataclasses.field(default_factory=dict)  # arm -> queue samples
    seeds: list[int] = dataclasses.field(default_factory=list)   # the spec's seed values
    # The bursts the run recorded it ran (raw/burst_schedule.json; testbed.rundir).
    schedule: BurstSchedule | None = None

    @property
    def units(self) -> list[tuple[str, int]]:
        """(arm, seed) in the order they ran: seed by seed, the spec's arms within each."""
        return [(arm, seed) for seed in self.seeds for arm in self.arms]

    def unit_events(self, arm: str, seed: int) -> list[dict]:
        return [e for e in self.events[arm] if e["seed"] == seed]

    @property
    def grad_bytes(self) -> int | None:
        """Gradient bytes per worker and round, as the workers measured their model."""
        gb = [e["grad_bytes"] for arm in self.arms for e in self.events[arm]
              if e["event"] == "start" and e["role"] == "worker"]
        return max(gb) if gb else None

    @property
    def data(self) -> dict | None:
        """The model and data-set digest the workers said they trained on (raw-log schema 6's
        ``data_sha256``); None when no worker said. Workers that disagree: every digest, sorted,
        joined by commas, so the summary shows the disagreement instead of picking one."""
        starts = [e for arm in self.arms for e in self.events[arm]
                  if e["event"] == "start" and e["role"] == "worker"]
        if not starts:
            return None
        models = sorted({e["model"] for e in starts})
        digests = sorted({str(e.get("data_sha256")) for e in starts})
        sha = None if digests == ["None"] else ",".join(digests)
        return {"model": ",".join(models), "sha256": sha}


#: The longest log line read; an event is a few hundred bytes, so a longer (hostile) line is skipped.
MAX_LINE = 1 << 20


def _read_jsonl(path: pathlib.Path, arm: str, seed: int | None, problems: list[str]) -> list[dict]:
    """The events of one unit's log, each given its unit's ``seed``; a line that is not
    one of `EVENTS`, or names another arm or seed, is skipped and said.

    ``seed`` None: a log outside the seed directories (a manual burst's), whose
    lines keep the seed they carry, if any.
    """
    out = []
    rel = path.relative_to(path.parents[1 if seed is None else 2]).as_posix()
    rel = f"raw/{rel}"
    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(iter(lambda: fh.readline(MAX_LINE + 1), ""), 1):
            if len(line) > MAX_LINE:  # skip the rest of it unread into memory at once
                while line and not line.endswith("\n"):
                    line = fh.readline(MAX_LINE + 1)
                problems.append(f"{rel}:{n}: a line over {MAX_LINE} bytes, skipped")
                continue
            line = line.strip()
            if not line:
                continue
            try:
                obj = check_event(json.loads(line))
            except (json.JSONDecodeError, RecursionError):  # RecursionError: nested past the parser's depth
                # A crashed process can leave a truncated last line: keep the rest.
                problems.append(f"{rel}:{n}: not a JSON line, skipped")
                continue
            except MalformedEvent as exc:
                problems.append(f"{rel}:{n}: {exc}, skipped")
                continue
            if obj["arm"] != arm:
                problems.append(f"{rel}:{n}: event of arm {obj['arm']!r} in raw/{arm}/, skipped")
                continue
            if seed is not None and obj.get("seed", seed) != seed:
                problems.append(f"{rel}:{n}: event of seed {obj['seed']!r} in "
                                f"raw/{arm}/seed-{seed}/, skipped")
                continue
            if seed is not None:
                obj["seed"] = seed
            out.append(obj)
    return out


def load_spec(run_dir: pathlib.Path) -> specmod.Spec:
    """RUN/spec.toml, validated as `dblp-testbed run` validated it."""
    path = run_dir / "spec.toml"
    if not path.exists():
        raise RawError(f"{path}: not found (is {run_dir} a run directory?)")
    try:
        return specmod.load(str(path))
    except InputError as exc:
        raise RawError(f"{path}: {exc}") from None


def load_raw(run_dir) -> RawRun:
    """Read RUN/raw/<arm>/seed-<seed>/*.jsonl for the spec's arms and seeds, RUN/spec.toml
    and RUN/manifest.json.

    A unit directory that is not one of the spec's arms and seeds is
    ignored and said. Burst lines in RUN/raw/<arm>/bursts.jsonl (manual
    bursts, which no unit announced) go to the unit of that arm whose
    manifest window [started_ns, ended_ns] holds the burst's start.
    """
    run_dir = pathlib.Path(run_dir)
    raw = run_dir / "raw"
    if not raw.is_dir():
        raise RawError(f"{raw}: no raw/ directory (is {run_dir} a run directory?)")
    spec = load_spec(run_dir)
    manifest = read_manifest(run_dir)
    schedule = read_burst_schedule(run_dir, spec)
    problems: list[str] = []
    # The spec's arms, in its order: an arm that never started is reported as such.
    arms, seeds = spec.arms, spec.seed_values
    for p in sorted(raw.iterdir()):
        if p.is_dir() and p.name not in arms and any(p.glob("**/*.jsonl")):
            problems.append(f"raw/{p.name}/: not an arm of the spec, ignored")
    events, bursts, queue = {}, {}, {}
    for arm in arms:
        evs, bs, qs = [], [], []
        for p in sorted((raw / arm).glob("*/")):
            if seed_of_dir(p.name) not in seeds and any(p.glob("*.jsonl")):
                problems.append(f"raw/{arm}/{p.name}/: not a seed of the spec "
                                f"({', '.join(map(str, seeds))}), ignored")
        for seed in seeds:
            d = unit_dir(run_dir, arm, seed)
            if not d.is_dir():
                problems.append(f"arm {arm} seed {seed}: no raw/{arm}/seed-{seed}/ directory "
                                "(the unit never started)")
            for path in sorted(d.glob("*.jsonl")):
                for obj in _read_jsonl(path, arm, seed, problems):
                    {"burst": bs, "queue": qs}.get(obj["event"], evs).append(obj)
        bs += _manual_bursts(raw / arm / "bursts.jsonl", arm, manifest, problems)
        events[arm], bursts[arm], queue[arm] = evs, bs, qs
    return RawRun(run_dir, arms, events, bursts, spec, manifest, problems, queue, seeds,
                  schedule)


def _manual_bursts(path: pathlib.Path, arm: str, manifest: dict, problems: list[str]) -> list[dict]:
    """Burst lines outside the seed directories, each placed in its unit by time."""
    if not path.exists():
        return []
    windows = [(u["seed"], u["started_ns"], u["ended_ns"]) for u in unit_records(manifest, arm)
               if "started_ns" in u and "ended_ns" in u]
    out = []
    for b in _read_jsonl(path, arm, None, problems):
        t = b["actual_start_ns"] if b["actual_start_ns"] is not None else b["requested_start_ns"]
        seeds = [s for s, start, end in windows if start <= t <= end]
        if not seeds:
            problems.append(f"raw/{arm}/bursts.jsonl: burst {b['id']} started outside every "
                            f"unit of arm {arm}, ignored")
            continue
        out.append({**b, "seed": seeds[0]})
    return out
