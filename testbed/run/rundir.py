"""Run directories: created fresh, never overwritten, self-describing.

A run directory holds the resolved spec, a manifest (what ran, on what, and
how it ended), `raw/` (everything measured) and the files derived from `raw/`.
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

from testbed.config.spec import Spec
from testbed.errors import InputError

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"


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

    Without ``--out`` the name is ``results/NAME-TIME``; a run started in the
    same second (another process, or this one again) takes ``NAME-TIME-2``
    and so on: ``mkdir`` either creates the directory or fails, so two runs
    can never claim the same one. With ``--out``, creating ``raw/`` is the
    claim: of two runs given the same empty directory, one is refused.
    """
    try:
        if out is None:
            stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
            RESULTS.mkdir(parents=True, exist_ok=True)
            path, n = RESULTS / f"{spec.name}-{stamp}", 1
            while True:
                try:
                    path.mkdir()
                    break
                except FileExistsError:
                    n += 1
                    path = RESULTS / f"{spec.name}-{stamp}-{n}"
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


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cmd(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=ROOT)
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
                     ("dblp-testbed", "torch", "os-ken", "mininet", "scapy", "pandas",
                      "numpy", "scikit-learn", "matplotlib")},
        "ovs": ovs.splitlines()[0] if ovs else None,
    }


class Manifest:
    """The run's manifest.json, updated atomically as the run progresses."""

    def __init__(self, run_dir: pathlib.Path, spec: Spec, capabilities: dict | None = None):
        self.path = run_dir / "manifest.json"
        self.data = {
            "name": spec.name,
            "seed": spec.seed,
            "arms": {a: {"status": "pending"} for a in spec.arms},
            "status": "running",
            "started_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "started_ns": time.time_ns(),
            "pid": os.getpid(),
            "environment": describe_environment(),
            "capabilities": capabilities or {},
        }
        self.write()

    def arm(self, arm: str, **fields):
        self.data["arms"].setdefault(arm, {}).update(fields)
        self.write()

    def finish(self, status: str, error: str | None = None):
        self.data["status"] = status
        self.data["ended_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        if error:
            self.data["error"] = error
        self.write()

    def update(self, **fields):
        self.data.update(fields)
        self.write()

    def write(self):
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)
