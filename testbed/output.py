"""Where a command's output goes: results to stdout or a JSON file, progress to stderr.

One convention for every command that prints results: the human text on
stdout, or with ``--json`` one JSON object on one line instead (``--json-file PATH``
writes the object to PATH and keeps the text). What a long command is doing goes
to stderr at the one verbosity the CLI sets (``-q``, ``-v``), so scripts
read stdout undisturbed. Warnings and errors show at every level: a quiet
run still says what went wrong.
"""
from __future__ import annotations

import functools
import json
import os
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


#: ``json_out`` of a command: the object goes to stdout (``--json``); any other value is a path.
JSON_STDOUT = "-"


def json_option(f: Callable) -> Callable:
    """``--json`` (a flag) and ``--json-file PATH``, handed to ``f`` as one ``json_out``.

    Why a flag: ``--json [FILE]`` with an optional value took the next word as
    its file, so ``run --json my.toml`` ran the default preset and then wrote
    its answer over my.toml, and ``report --json RUN_DIR`` lost its RUN_DIR.
    A flag never takes a word; the file has an option of its own. ``f`` still
    gets one ``json_out`` (None, `JSON_STDOUT` or a path) for `results`.
    The old spelling ``--json NAME.json`` keeps working where it cannot hurt
    (`legacy_json_args`): the command line rewrites it before parsing.
    """
    @functools.wraps(f)
    def command(*args, json_stdout: bool, json_file: str | None, **kwargs):
        if json_stdout and json_file:
            raise click.UsageError("--json prints the results on stdout and --json-file writes "
                                   "them to a file: give one of them")
        return f(*args, json_out=JSON_STDOUT if json_stdout else json_file, **kwargs)

    command = click.option(
        "--json-file", "json_file", type=click.Path(dir_okay=False), default=None, metavar="PATH",
        help="Also write the results as one JSON object to PATH (the text stays on stdout).")(command)
    return click.option(
        "--json", "json_stdout", is_flag=True,
        help="Results as one JSON object on one line of stdout, instead of the text.")(command)


def has_json_option(cmd: click.Command) -> bool:
    """Whether ``cmd`` was declared with `json_option`."""
    return any(isinstance(p, click.Option) and "--json-file" in p.opts for p in cmd.params)


def legacy_json_args(args: list[str]) -> list[str]:
    """``args`` with the old ``--json FILE`` spellings of a `json_option` command rewritten.

    ``--json NAME.json`` becomes ``--json-file NAME.json`` only where NAME.json
    does not exist yet: a word that names no file cannot be an input the user
    meant as an argument, and a file that is not there is not overwritten.
    Anything else after ``--json`` is left where it stands, a positional
    argument (``run --json my.toml`` runs my.toml). The explicit
    ``--json=VALUE`` means what it meant: ``-`` is stdout, a ``.json`` path
    the file; any other value is refused. Reference records
    (`testbed.references.Command`) and the results pages carry the old
    spelling, so their commands still run as shown. Words after ``--`` are
    never touched.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            out.extend(args[i:])
            break
        nxt = args[i + 1] if i + 1 < len(args) else None
        if word == "--json" and nxt is not None and _new_json_path(nxt):
            out += ["--json-file", nxt]
            i += 2
            continue
        if word.startswith("--json="):
            value = word.partition("=")[2]
            if value == JSON_STDOUT:
                out.append("--json")
            elif value.endswith(".json"):
                out += ["--json-file", value]
            else:
                raise click.UsageError(f"{word}: --json is a flag; write the results to a file "
                                       "with --json-file PATH")
        else:
            out.append(word)
        i += 1
    return out


def _new_json_path(word: str) -> bool:
    return word.endswith(".json") and not word.startswith("-") and not os.path.lexists(word)


def results(obj, json_out: str | None, text: Callable[[], None]) -> None:
    """Emit a command's results by the convention above; ``text`` prints the human form."""
    if json_out == JSON_STDOUT:
        click.echo(json.dumps(obj))  # one line: `| tail -1`, `| jq` and line readers all work
        return
    text()
    if json_out:
        with open(json_out, "w") as f:
            json.dump(obj, f, indent=1)
        say(f"wrote {json_out}")
