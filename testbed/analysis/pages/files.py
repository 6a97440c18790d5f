"""Reading a reference's kept files, failing with the `reproduce` command that makes them.

A block whose reference has no file yet is an `InputError` naming the
command (``dblp-testbed reproduce NAME``), not a traceback: a reader who
adds a reference to a page learns in one line what to run.
"""
from __future__ import annotations

import json
import pathlib

from testbed.errors import InputError


def load_summary(ref_dir: pathlib.Path) -> dict:
    """A run reference's summary.json."""
    path = ref_dir / "summary.json"
    if not path.is_file():
        raise InputError(f"{path} does not exist; run `dblp-testbed reproduce {ref_dir.name}`")
    return json.loads(path.read_text())


def read_json(path: pathlib.Path) -> dict:
    """One JSON file a command reference kept."""
    if not path.is_file():
        raise InputError(f"{path} does not exist; run `dblp-testbed reproduce {path.parent.name}`")
    return json.loads(path.read_text())


def read_jsons(ref_dir: pathlib.Path, pattern: str) -> list[dict]:
    """Every JSON file of ``ref_dir`` matching ``pattern``, sorted by name; at least one."""
    docs = [read_json(p) for p in sorted(ref_dir.glob(pattern))]
    if not docs:
        raise InputError(f"{ref_dir} holds no {pattern}; run `dblp-testbed reproduce {ref_dir.name}`")
    return docs
