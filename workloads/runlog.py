"""JSON-lines run log in the run-directory contract of COMMON.md (one object per line, flushed)."""
from __future__ import annotations

import json
import math
import os
import sys
import time


def _clean(v):
    """JSON has no NaN/inf: write them as null so every reader can parse the line."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class RunLog:
    """Appends events for one (arm, role, rank); every line carries "event" and "arm"."""

    def __init__(self, path: str | None, arm: str, role: str, rank: int):
        self.arm, self.role, self.rank = arm, role, rank
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fh = open(path, "a", buffering=1)
        else:
            self._fh = sys.stdout
        self.path = path

    def write(self, event: str, **fields) -> dict:
        rec = {"event": event, "arm": self.arm, "role": self.role, "rank": self.rank}
        rec.update(fields)
        self._fh.write(json.dumps(_clean(rec), default=str) + "\n")
        self._fh.flush()
        return rec

    def close(self) -> None:
        if self._fh is not sys.stdout:
            self._fh.close()


def now_ns() -> int:
    return time.time_ns()
