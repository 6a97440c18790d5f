"""Where a command's output goes: results to stdout or a JSON file, progress to stderr.

One convention for every command that prints results: the human text on
stdout, or with ``--json`` one JSON object on one line instead (``--json FILE`` writes
the object to FILE and keeps the text). What a long command is doing goes
to stderr at the one verbosity the CLI sets (``-q``, ``-v``), so scripts
read stdout undisturbed. Warnings and errors show at every level: a quiet
run still says what went wrong.
"""
from __future__ import annotations

import json
from collections.abc import Callable

import click

QUIET, NORMAL, VERBOSE = 0, 1, 2
_level = NORMAL


def set_level(level: int) -> None:
    global _level
    _level = max(QUIET, min(VERBOSE, level))


def level() -> int:
    return _level


def say(msg: str, nl: bool = True) -> None:
    """Progress a user wants by default (run directory, arm status, ETA)."""
    if _level >= NORMAL:
        click.echo(msg, nl=nl, err=True)


def detail(msg: str) -> None:
    """What only -v shows (fabric start-up steps, per-arm commands)."""
    if _level >= VERBOSE:
        click.echo(msg, err=True)


def warn(msg: str) -> None:
    """A problem that does not stop the command; shown even with -q."""
    click.echo(msg, err=True)


def json_option(f: Callable) -> Callable:
    """``--json [FILE]``: the results as one JSON object, on stdout or in FILE."""
    return click.option(
        "--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
        help="Results as one JSON object: on stdout instead of the text, or written to FILE.")(f)


def results(obj, json_out: str | None, text: Callable[[], None]) -> None:
    """Emit a command's results by the convention above; ``text`` prints the human form."""
    if json_out == "-":
        click.echo(json.dumps(obj))  # one line: `| tail -1`, `| jq` and line readers all work
        return
    text()
    if json_out:
        with open(json_out, "w") as f:
            json.dump(obj, f, indent=1)
        say(f"wrote {json_out}")
