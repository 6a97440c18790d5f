"""What made a run: the data it trained on and the machine and software it ran on.

A figure depends on more than the transport: other data train another model,
another kernel or Open vSwitch datapath forwards at another cost, another
torch computes at another speed. The summary carries both (``data``, from the
workers' start lines; ``environment``, from the manifest), and `compare`
names every difference before any verdict, so a reader knows what else
changed before reading a difference as the transport's.
"""
from __future__ import annotations

#: The summary's ``environment`` keys, in order: what could move a figure.
ENVIRONMENT_KEYS = ("python", "torch", "kernel", "machine", "cpus", "ovs", "datapath", "c_core",
                    "revision", "dirty")


def environment_of(manifest: dict) -> dict | None:
    """The summary's ``environment`` from a run's manifest (`testbed.rundir`); None when the
    manifest has none (a hand-made run directory, or one written before it was recorded)."""
    env = manifest.get("environment") or {}
    if not env:
        return None
    caps = manifest.get("capabilities") or {}
    core = caps.get("c_core") or {}
    versions = env.get("versions") or {}
    return {
        "python": env.get("python"),
        "torch": versions.get("torch"),
        "kernel": env.get("kernel"),
        "machine": env.get("machine"),
        "cpus": env.get("cpus"),
        "ovs": env.get("ovs"),
        # "user" (one forwarding thread) or "kernel": the fabric's capacity differs by far.
        "datapath": caps.get("datapath"),
        # The transport's C core and the library that tags keyed datagrams, or None: the
        # per-datagram work in Python instead.
        "c_core": (core.get("mac") or "built") if core.get("loaded") else None,
        "revision": env.get("git_revision"),
        "dirty": env.get("git_dirty"),
    }


def differences(run: dict, ref: dict) -> list[str]:
    """What could move a figure and differs between a run's summary and the reference's, one
    line each: the data set (its model and pinned digest, summary ``data``), then the
    machine and software (summary ``environment``).

    Said before the verdicts, never a verdict of its own. A summary made before the field
    existed (a committed reference judged again keeps its runs' fields) does not say, and
    that is said too.
    """
    return _data(run.get("data"), ref.get("data")) + \
        _environment(run.get("environment"), ref.get("environment"))


def _data(mine, theirs) -> list[str]:
    if mine == theirs:
        return []
    if theirs is None or mine is None:
        who = "the reference" if theirs is None else "the run"
        return [f"data: {who} does not record which data it trained on (no summary field "
                "'data': made before version 7, or judged again since), so the data may differ"]
    return [f"data {key}: the run's {mine.get(key)}, the reference's {theirs.get(key)}"
            for key in ("model", "sha256") if mine.get(key) != theirs.get(key)]


def _environment(mine, theirs) -> list[str]:
    if mine == theirs:
        return []
    if theirs is None or mine is None:
        who = "the reference" if theirs is None else "the run"
        return [f"environment: {who} does not record what it ran on (no summary field "
                "'environment': made before version 8), so the machine or software may differ"]
    return [f"environment {key}: the run's {mine.get(key)}, the reference's {theirs.get(key)}"
            for key in ENVIRONMENT_KEYS if mine.get(key) != theirs.get(key)]
