"""Run directories: created fresh, never overwritten, self-describing.

A run directory holds the resolved spec, a manifest (what ran, on what, and
how it ended), `raw/` (everything measured) and the files derived from `raw/`.
The manifest is rewritten atomically whenever the run's status changes, so a
crash at any point still leaves an honest account of how far it got.
"""
from __future__ import annotations

from testbed import REPO_ROOT
from testbed.errors import InputError
import datetime as _dt
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
import time

from testbed.config.spec import Spec



class RunDirError(InputError):
    """The run directory cannot be created as asked."""


def new_run_dir(spec: Spec, out: str | None) -> pathlib.Path:
    """Claim a fresh directory; refuse to reuse one that holds anything."""
    if out is None:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        base = REPO_ROOT / "results" / f"{spec.name}-{stamp}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
    else:
        path = pathlib.Path(out).resolve()
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise RunDirError(f"--out {out}: exists and is not empty; "
                              "runs are never overwritten, choose a new directory")
    path.mkdir(parents=True, exist_ok=True)
    (path / "raw").mkdir()
    (path / "spec.toml").write_text(spec.to_toml())
    return path


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
