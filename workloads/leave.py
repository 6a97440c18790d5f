"""How a worker or server process ends: at once, without the interpreter's teardown.

Python's teardown frees every module object by object before the process ends.
A worker has torch, torch._dynamo (the optimizer imports it) and sympy loaded,
and freeing them costs about 0.6 s of CPU; a unit's four processes do it at
once on two cores, and the unit waited 1.2 s after its last round for them
(the smoke preset's units, 12 s each). The kernel reclaims memory and sockets
at once, and what the process must finish it has finished before this: its
raw log is flushed line by line and closed, its transport or process group is
closed in ``train``'s ``finally``. Only the standard streams are left, flushed
here.
"""
from __future__ import annotations

import os
import sys


def leave(code: int | None) -> None:
    """End the process with ``code`` (0 for None) once stdout and stderr are flushed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream has nothing more to give
    os._exit(code or 0)
