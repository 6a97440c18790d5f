"""The run directory's format: its layout, spec.toml, the burst schedule and manifest.json.

Why here, beside the sub-packages rather than in one of them: the run
(`testbed.run`) writes a run directory and the analysis (`testbed.analysis`)
reads it, and `report DIR` reads one a year later. Both sides import this
one declaration, so the analysis never imports the run and the format has
one home.

A run directory holds the resolved spec, a manifest (what ran, on what, and
how it ended), `raw/` (everything measured) and the files derived from `raw/`.
`raw/` holds one directory per unit, an arm trained with one seed:
`raw/<arm>/seed-<seed>/` (`unit_dir`; also for a single seed, so every
reader sees one layout), beside the run's own files (`burst_schedule.json`,
the controller's logs, `port_stats.jsonl`).
The manifest is rewritten atomically whenever the run's status changes, so a
crash at any point still leaves an honest account of how far it got.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
import tempfile
import time

from controllers.bursts import BurstEvery, BurstSchedule, spec_bursts
from testbed import REPO_ROOT
from testbed.config.spec import Spec
from testbed.errors import InputError
from workloads import runlog


def results_dir() -> pathlib.Path:
    """Where run directories go without ``--out``: ``results/`` under the working directory.

    Why not under the checkout (`REPO_ROOT`): installed from a wheel, that is
    site-packages' parent, and runs would land inside the installation. From
    the repository's root, where the README's commands are run, it is the
    same ``results/`` as before; `reproduce` and the studies already put
    their defaults under the working directory's ``results/``. Read when a
    run starts, not at import, so a ``cd`` (or a test's) counts.
    """
    return pathlib.Path.cwd() / "results"


class RunDirError(InputError):
    """The run directory cannot be created as asked."""


def check_out(out: str | None) -> pathlib.Path | None:
    """Refuse an ``--out`` that cannot become a fresh run directory, creating nothing.

    Called before anything else happens, so a bad path costs one line and
    leaves the machine as it was: it must be an empty directory or a path
    whose nearest existing parent is a directory this user may write in.
    """
    if out is None:
        return None
    path = pathlib.Path(out).resolve()
    if path.exists():
        if not path.is_dir():
            raise RunDirError(f"--out {out}: exists and is not a directory; "
                              "runs are never overwritten, choose a new directory")
        if any(path.iterdir()):
            raise RunDirError(f"--out {out}: exists and is not empty; "
                              "runs are never overwritten, choose a new directory")
        parent = path
    else:
        parent = path.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise RunDirError(f"--out {out}: {parent} is a file, not a directory; "
                              "choose a path under a directory")
    try:  # the kernel's answer, which permission bits alone do not give (root, read-only mounts)
        os.rmdir(tempfile.mkdtemp(prefix=".dblp-testbed-probe-", dir=parent))
    except OSError as exc:
        raise RunDirError(f"--out {out}: cannot create anything in {parent} ({exc.strerror}); "
                          "choose a directory you can write in") from None
    return path


def new_run_dir(spec: Spec, out: str | None) -> pathlib.Path:
    """Claim a fresh directory atomically; refuse to reuse one that holds anything.

    Without ``--out`` the name is ``results/NAME-TIME`` (`results_dir`); a run started in the
    same second (another process, or this one again) takes ``NAME-TIME-2``
    and so on: ``mkdir`` either creates the directory or fails, so two runs
    can never claim the same one. With ``--out``, creating ``raw/`` is the
    claim: of two runs given the same empty directory, one is refused.
    """
    try:
        if out is None:
            stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
            results = results_dir()
            results.mkdir(parents=True, exist_ok=True)
            path, n = results / f"{spec.name}-{stamp}", 1
            while True:
                try:
                    path.mkdir()
                    break
                except FileExistsError:
                    n += 1
                    path = results / f"{spec.name}-{stamp}-{n}"
        else:
            path = check_out(out)
            path.mkdir(parents=True, exist_ok=True)
        try:
            (path / "raw").mkdir()
        except FileExistsError:
            raise RunDirError(f"--out {out}: another run claimed it first; "
                              "choose a new directory") from None
        write_spec(path, spec)
    except OSError as exc:
        raise RunDirError(f"cannot create the run directory ({exc.strerror}: {exc.filename}); "
                          "choose another --out") from None
    return path


def write_spec(run_dir: pathlib.Path, spec: Spec) -> pathlib.Path:
    """``spec.toml``: the resolved spec, written so that it always parses again."""
    path = run_dir / "spec.toml"
    path.write_text(spec.to_toml(), encoding="utf-8")
    return path


#: The bursts every unit of the run is hit by: ``controllers.bursts.BurstSchedule.to_dict``.
BURST_SCHEDULE = "burst_schedule.json"


def resolve_bursts(spec: Spec) -> BurstSchedule:
    """The spec's bursts as one explicit, seeded schedule for every arm.

    The generator (`[burst_every]`) and the explicit `[[bursts]]` become one
    schedule before the first arm starts, so every arm is hit at the same
    rounds by the same bursts. A loaded spec carries it (``Spec.schedule``).
    """
    if spec.schedule is not None:
        return BurstSchedule.from_dict(spec.schedule)
    return BurstSchedule.resolve(spec_bursts(spec.bursts), BurstEvery(**spec["burst_every"]),
                                 spec["training"]["rounds"], spec.seed)


def write_burst_schedule(run_dir: pathlib.Path, schedule: dict) -> dict:
    """Write the run's resolved bursts (``Spec.schedule``) into ``raw/burst_schedule.json``;
    the document the controller is handed too."""
    (pathlib.Path(run_dir) / "raw" / BURST_SCHEDULE).write_text(json.dumps(schedule, indent=2))
    return schedule


#: The Wireshark dissector of the code that wrote the captures (``dblp.wireshark``).
DISSECTOR = "dblp.lua"


def write_dissector(run_dir: pathlib.Path) -> pathlib.Path:
    """Write ``raw/dblp.lua``: the dissector for this code's wire format, beside the captures.

    A run's pcaps are read later, by code whose wire format may have moved
    on; the dissector generated when they were written decodes them as they
    are (``tshark -X lua_script:RUN_DIR/raw/dblp.lua``).
    """
    from dblp.wireshark import lua_dissector
    path = pathlib.Path(run_dir) / "raw" / DISSECTOR
    path.write_text(lua_dissector())
    return path


def read_burst_schedule(run_dir, spec: Spec) -> BurstSchedule:
    """The schedule the run recorded and ran.

    That record, not a fresh resolution of the spec by today's code, says
    what each burst was. A raw directory without it (one built by hand)
    falls back to resolving the spec's bursts.
    """
    recorded = pathlib.Path(run_dir) / "raw" / BURST_SCHEDULE
    if recorded.is_file():
        return BurstSchedule.from_dict(json.loads(recorded.read_text()))
    return resolve_bursts(spec)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cmd(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=REPO_ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def describe_environment() -> dict:
    """Versions and revision, so a result can be traced to what produced it."""
    rev = _cmd(["git", "rev-parse", "HEAD"])
    dirty = _cmd(["git", "status", "--porcelain", "--untracked-files=no"])
    ovs = _cmd(["ovs-vsctl", "--version"])
    return {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "git_revision": rev,
        "git_dirty": bool(dirty) if dirty is not None else None,
        "versions": {d: _version(d) for d in
                     ("dblp-testbed", "torch", "os-ken", "scapy", "pandas",
                      "numpy", "scikit-learn", "matplotlib")},
        "ovs": ovs.splitlines()[0] if ovs else None,
        # Every package, so a result can be re-run on the same set a year later.
        "python_packages": python_packages(),
        "debian_packages": debian_packages(),
    }


def python_packages() -> dict[str, str]:
    """Every installed Python distribution and its version (the venv's `pip freeze`)."""
    return dict(sorted((d.metadata["Name"], d.version)
                       for d in importlib.metadata.distributions() if d.metadata["Name"]))


def debian_packages() -> dict[str, str] | None:
    """Every installed Debian package and its version; None off Debian (no dpkg-query)."""
    out = _cmd(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n"])
    if out is None:
        return None
    pkgs = {}
    for line in out.splitlines():
        name, version, status = (line.split("\t") + ["", "", ""])[:3]
        if status.startswith("ii"):
            pkgs[name] = version
    return pkgs


# The manifest.json format, declared once: its writer (Manifest) and its
# reader (read_manifest) both check against these fields. History:
#   1: first declared version: "schema" and "raw_log_schema" added; the
#      undocumented "addresses", "physics" and fidelity "flags" dropped
#      (nothing wrote them).
#   2: repeated seeds: "units" (one record per arm x seed, in the order they
#      ran) replaces the per-arm "arms"; "seeds" lists the seed values. The
#      raw/ layout became raw/<arm>/seed-<seed>/. Version 1 is refused, not
#      read as one seed: its raw/<arm>/ layout is one this code no longer
#      reads, so an old run directory cannot be re-analysed by this version
#      (re-run its spec.toml, or analyse it with the revision that wrote it).
#   3: fidelity "cpu_steal_frac" (optional): CPU time the hypervisor gave to
#      other guests during the unit. Version 2 reads as is (it lacks the field);
#      a reader of version 2 refuses version 3 by its number, not by the field.
#   4: the emulator's invariants (testbed.invariants) in the fidelity record:
#      the bottleneck's rate while busy and packet spacing from a kernel trace
#      of its queue, the transport's pacing error, and the CPU budget per
#      component; the CPU figures now cover the unit's rounds only (from the
#      first round's start to the last one's end), not the workers' start-up.
#      Versions 2 and 3 read as is (they lack the fields, so those invariants
#      are not judged for them).
#   5: a run across machines (testbed.emulation.cluster): "cluster" (the
#      servers, nodes per server, tunnel ends, start-up timings) and the
#      fidelity record's "tunnel_*" fields, both optional (a run on one machine
#      has neither). Versions 2-4 read as is.
MANIFEST_SCHEMA = 5
KNOWN_MANIFEST_SCHEMAS = frozenset({2, 3, 4, 5})

_F = runlog.Field
MANIFEST_FIELDS = (
    _F("schema", "int", doc="version of this format"),
    _F("raw_log_schema", "int", doc="version of the raw-log events in raw/ (workloads.runlog)"),
    _F("name", "str", doc="spec name"),
    _F("seed", "int", doc="spec seed: the first of the seed values"),
    _F("seeds", "list", doc="the seed values every arm ran with: seed, seed+1, ..., "
       "seed+seeds-1"),
    _F("units", "list", doc="UNIT_FIELDS of every arm x seed, in the order they ran "
       "(seed by seed, the spec's arms within a seed)"),
    _F("status", "str", doc="running | ok | failed | error | interrupted"),
    _F("started_utc", "str", doc="ISO time the run started"),
    _F("started_ns", "int", doc="time.time_ns() the run started"),
    _F("pid", "int", doc="the harness's process id"),
    _F("environment", "dict", doc="versions, revision and every installed Python and Debian "
       "package (describe_environment)"),
    _F("capabilities", "dict", doc="what the machine could emulate"),
    _F("ended_utc", "str", required=False, doc="ISO time the run ended"),
    _F("error", "str", required=False, doc="why the run ended early"),
    _F("placement", "dict", required=False, doc="server and worker hosts"),
    _F("fabric_startup_s", "num", required=False, doc="seconds to build the fabric"),
    _F("cluster", "dict", required=False,
       doc="a fabric across machines (schema 5): servers, switches and hosts per server, each "
       "server's tunnel address, crossing links, tunnel kind and overhead, clock offsets, start-up timings"),
    _F("dblp_port", "int", required=False, doc="the dblp transport's UDP port in the captures"),
    _F("rtt_ms", "num", required=False, nullable=True,
       doc="median idle worker-server RTT (null: ping failed)"),
    _F("report_error", "str", required=False, doc="why building the outputs failed"),
)
UNIT_FIELDS = (
    _F("arm", "str", doc="spec arm name"),
    _F("seed", "int", doc="the seed the arm ran with (its logs: raw/<arm>/seed-<seed>/)"),
    _F("status", "str", doc="pending | running | ok | failed | interrupted | skipped"),
    _F("started_ns", "int", required=False),
    _F("ended_ns", "int", required=False),
    _F("error", "str", required=False, doc="the failed processes' last log lines"),
    _F("fidelity", "dict", required=False, doc="FIDELITY_FIELDS, measured during the unit"),
)
FIDELITY_FIELDS = (
    _F("cpu_busy_frac", "num", required=False, doc="machine-wide CPU busy fraction"),
    _F("cpu_steal_frac", "num", required=False,
       doc="machine-wide fraction of CPU time stolen by the hypervisor (schema 3)"),
    _F("bottleneck", "str", required=False, doc="interface watched as the bottleneck"),
    _F("shaped_mbps", "num", required=False, doc="its shaped rate"),
    _F("achieved_mbps", "num", required=False, doc="best rate it carried over a window"),
    _F("queue_drops", "int", required=False, nullable=True, doc="its qdisc's drops"),
    _F("ovs_drops", "int", required=False, nullable=True, doc="packets Open vSwitch dropped"),
    # With raw-log schema 2 (an older reader refuses the manifest on that first):
    _F("queue_samples", "int", required=False,
       doc="occupancy samples of its queue written to raw/<arm>/seed-<seed>/queue.jsonl"),
    _F("queue_peak_packets", "int", required=False, nullable=True,
       doc="most packets those samples saw queued (null: no sample)"),
    # Schema 4 (testbed.invariants judges them):
    _F("queue_source", "str", required=False,
       doc="trace: the queue samples and link invariants come from a kernel trace of the port"),
    _F("trace_packets", "int", required=False, doc="departures the trace recorded"),
    _F("trace_lost_events", "int", required=False, doc="events the trace's buffer lost"),
    _F("trace_complete_s", "num", required=False, nullable=True,
       doc="seconds the trace holds every event of, from its first: the span the link "
           "invariants judge (all of the unit when nothing was lost)"),
    _F("link_busy_gaps", "int", required=False,
       doc="back-to-back departures (the queue held the next packet when one left)"),
    _F("link_busy_rate_frac", "num", required=False, nullable=True,
       doc="bits sent over those gaps' time, over the shaped rate (null: too few gaps)"),
    _F("link_spacing_ok_frac", "num", required=False, nullable=True,
       doc="share of those gaps at most one full packet time longer than line rate allows"),
    _F("pacing_late_frac", "num", required=False, nullable=True,
       doc="the worst process's pacer lateness over its sending time (null: nothing paced)"),
    _F("cpu_budget", "dict", required=False,
       doc="component -> share of one core over the unit's rounds (testbed.run.budget)"),
    _F("cpu_window_s", "num", required=False,
       doc="seconds the CPU figures cover: the unit's rounds, first start to last end"),
    # Schema 5, a fabric across machines (testbed.emulation.cluster.ClusterFabric.unit_fidelity):
    _F("tunnel_bytes", "int", required=False, doc="bytes the links between machines carried (inner frames)"),
    _F("tunnel_packets", "int", required=False, doc="frames they carried"),
    _F("tunnel_overhead_frac", "num", required=False, nullable=True,
       doc="bytes the tunnels added on the machines' network per byte carried (null: none carried)"),
    _F("tunnel_busiest_mbps", "num", required=False,
       doc="the busiest tunnel direction's mean rate over the unit"),
    _F("tunnel_shaped_mbps", "num", required=False, nullable=True, doc="the rate every link is shaped to"),
    _F("servers_cpu", "dict", required=False,
       doc="other server -> its busy_frac, steal_frac and window_s over the unit's rounds"),
    _F("others_cpu_busy_frac", "num", required=False, nullable=True,
       doc="the busiest other server's CPU busy fraction (null: none sampled)"),
    _F("others_cpu_steal_frac", "num", required=False, nullable=True,
       doc="the most any other server's CPU was stolen by its hypervisor (null: none sampled)"),
)


def unit_records(manifest: dict, arm: str | None = None) -> list[dict]:
    """The manifest's unit records (UNIT_FIELDS) in the order they ran; only ``arm``'s if given."""
    return [u for u in manifest["units"] if arm is None or u["arm"] == arm]


def unit_dir(run_dir, arm: str, seed: int) -> pathlib.Path:
    """RUN/raw/<arm>/seed-<seed>: one unit's logs, captures and transport configs."""
    return pathlib.Path(runlog.unit_dir(pathlib.Path(run_dir) / "raw", arm, seed))


class ManifestError(InputError):
    """manifest.json is missing, malformed or of an unknown version."""


def check_manifest(data, where: str = "manifest.json") -> dict:
    """``data`` if it matches the declaration (any known version), else ManifestError."""
    try:
        # Before the fields: version 1 has fields this one does not, and deserves its own answer.
        if isinstance(data, dict) and data.get("schema") == 1 and data.get("schema") is not True:
            raise runlog.MalformedEvent(
                f"{where}: schema version 1 is from before repeated seeds (raw/<arm>/, not "
                "raw/<arm>/seed-<seed>/) and this dblp-testbed cannot re-analyse it: run its "
                "spec.toml again, or use the revision in its environment.git_revision")
        # The version before the fields too: a later version's new field is not "undeclared".
        if isinstance(data, dict) and isinstance(data.get("schema"), int) \
                and data["schema"] not in KNOWN_MANIFEST_SCHEMAS:
            raise runlog.MalformedEvent(
                f"{where}: schema version {data['schema']} is unknown (this dblp-testbed "
                f"reads {', '.join(map(str, sorted(KNOWN_MANIFEST_SCHEMAS)))})")
        runlog.check_fields(data, MANIFEST_FIELDS, where)
        if data["raw_log_schema"] not in runlog.KNOWN_VERSIONS:
            raise runlog.MalformedEvent(
                f"{where}: raw-log schema version {data['raw_log_schema']} is unknown (this "
                f"dblp-testbed reads {', '.join(map(str, sorted(runlog.KNOWN_VERSIONS)))})")
        seen = set()
        for i, rec in enumerate(data["units"]):
            runlog.check_fields(rec, UNIT_FIELDS, f"{where} units[{i}]")
            key = (rec["arm"], rec["seed"])
            if key in seen:
                raise runlog.MalformedEvent(f"{where} units[{i}]: arm {key[0]} seed {key[1]} "
                                            "is listed twice")
            seen.add(key)
            if "fidelity" in rec:
                runlog.check_fields(rec["fidelity"], FIDELITY_FIELDS,
                                    f"{where} units[{i}].fidelity")
    except runlog.MalformedEvent as exc:
        raise ManifestError(str(exc)) from None
    return data


def read_manifest(run_dir) -> dict:
    """RUN/manifest.json, checked against the declaration; ManifestError names the problem."""
    path = pathlib.Path(run_dir) / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{path}: not found (is {run_dir} a run directory?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: not readable JSON ({exc})") from None
    return check_manifest(data, str(path))


class Manifest:
    """The run's manifest.json, updated atomically as the run progresses.

    Every write is checked against MANIFEST_FIELDS: a field the declaration
    lacks is a bug and raises here, not in a reader months later.
    """

    def __init__(self, run_dir: pathlib.Path, spec: Spec, capabilities: dict | None = None):
        self.path = run_dir / "manifest.json"
        self.data: dict = {}
        self._write({
            "schema": MANIFEST_SCHEMA,
            "raw_log_schema": runlog.SCHEMA_VERSION,
            "name": spec.name,
            "seed": spec.seed,
            "seeds": spec.seed_values,
            "units": [{"arm": a, "seed": s, "status": "pending"}
                      for s in spec.seed_values for a in spec.arms],
            "status": "running",
            "started_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "started_ns": time.time_ns(),
            "pid": os.getpid(),
            "environment": describe_environment(),
            "capabilities": capabilities or {},
        })

    @classmethod
    def of(cls, run_dir) -> Manifest:
        """The manifest of a run directory that exists, to add to (`report_error`)."""
        self = cls.__new__(cls)
        self.path = pathlib.Path(run_dir) / "manifest.json"
        self.data = read_manifest(run_dir)
        return self

    def unit(self, arm: str, seed: int, **fields):
        """Update the record of the unit (arm, seed); a unit the run does not have is a bug."""
        units = [dict(u) for u in self.data["units"]]
        matches = [u for u in units if (u["arm"], u["seed"]) == (arm, seed)]
        if not matches:
            raise ValueError(f"bug: the run has no unit arm {arm} seed {seed}")
        matches[0].update(fields)
        self._write({**self.data, "units": units})

    def finish(self, status: str, error: str | None = None):
        ended = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self._write({**self.data, "status": status, "ended_utc": ended,
                     **({"error": error} if error else {})})

    def update(self, **fields):
        self._write({**self.data, **fields})

    def _write(self, data: dict):
        """Check, then replace manifest.json atomically; a refused update changes nothing."""
        try:
            check_manifest(data)
        except ManifestError as exc:
            raise ValueError(f"bug: the manifest does not match its declaration: {exc}") from None
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)
        self.data = data
