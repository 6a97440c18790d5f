"""The spec's own arms: ``[commands.NAME]`` and ``[ddp.NAME]`` tables, each one arm.

A spec may declare arms beside the built-in ones: a user's command
(`testbed.run.command`'s contract) or unmodified DDP over a torch.distributed
backend. Each table is checked field by field when the spec is read, and
registered as an arm (`testbed.config.arms`) when it is validated, before the
spec's ``arms`` are looked up.
"""
from __future__ import annotations

import copy
import re

from testbed.config.arms import Command, register_command, register_ddp_backend
from testbed.config.fields import NAME_RE, NUMBER, SpecError, check_type

#: The section that declares command arms: ``[commands.NAME]``, one table per arm.
COMMANDS = "commands"
#: A command arm's fields: name -> (TOML type, required, what to write).
COMMAND_FIELDS = {
    "worker": (list, True, "a list of strings, e.g. [\"python\", \"examples/udp_average.py\", "
                           "\"worker\"]"),
    "server": (list, False, "a list of strings, or leave it out (no aggregation server)"),
    "silence_s": (NUMBER, False, "seconds a worker may write nothing to its log, e.g. 60"),
}


def commands(tables) -> dict[str, dict]:
    """``[commands.NAME]`` tables, each checked field by field (the arm is made in `validate`)."""
    if not isinstance(tables, dict):
        raise SpecError(COMMANDS, "expected a table of command arms",
                        "write each as [commands.NAME] with worker = [...]")
    out = {}
    for name, table in tables.items():
        where = f"{COMMANDS}.{name}"
        if not isinstance(table, dict):
            raise SpecError(where, "expected a table", f"write it as [{where}]")
        for key, value in table.items():
            if key not in COMMAND_FIELDS:
                raise SpecError(f"{where}.{key}", "unknown field",
                                f"remove it; known fields: {', '.join(COMMAND_FIELDS)}")
            typ, _, fix = COMMAND_FIELDS[key]
            check_type(f"{where}.{key}", value, typ)
            if typ is list and not (value and all(isinstance(a, str) and a for a in value)):
                raise SpecError(f"{where}.{key}", f"{value!r} is not a non-empty list of "
                                "non-empty strings", f"write {fix}")
        for key, (_, required, fix) in COMMAND_FIELDS.items():
            if required and key not in table:
                raise SpecError(f"{where}.{key}", "missing", f"write {fix}")
        out[name] = copy.deepcopy(table)
    return out


def register_commands(commands: dict[str, dict]) -> None:
    """Register each command section as an arm (`testbed.config.arms.register_command`)."""
    for name, table in commands.items():
        where = f"{COMMANDS}.{name}"
        if not NAME_RE.match(name):
            raise SpecError(where, f"{name!r} is not a plain name",
                            "name the arm with letters, digits, '.', '_' or '-'")
        try:
            cmd = Command(tuple(table["worker"]),
                          tuple(table["server"]) if "server" in table else None,
                          float(table.get("silence_s", Command.silence_s)))
        except ValueError as exc:
            field = str(exc).split(" ", 1)[0]
            raise SpecError(f"{where}.{field}" if field in COMMAND_FIELDS else where, str(exc),
                            f"write {COMMAND_FIELDS.get(field, COMMAND_FIELDS['worker'])[2]}") \
                from None
        try:
            register_command(name, cmd)
        except ValueError as exc:
            raise SpecError(where, str(exc), "rename the command arm") from None


#: The section that declares DDP arms over a c10d backend: ``[ddp.NAME]``, one table per
#: arm (`testbed.config.arms.register_ddp_backend`).
DDP = "ddp"
#: A torch.distributed backend's name, as ``Backend.register_backend`` takes it.
BACKEND_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
#: A Python module's dotted name.
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: A DDP arm's fields: name -> (required, the rule its value follows, what to write).
DDP_FIELDS = {
    "backend": (True, BACKEND_RE, "the torch.distributed backend's name, e.g. \"mpi\" or the "
                                  "one your module registers"),
    "module": (False, MODULE_RE, "a dotted module name the workers import first (it calls "
                                 "torch.distributed.Backend.register_backend), e.g. "
                                 "\"mypkg.c10d\", or leave it out for a backend torch knows"),
}


def ddp_backends(tables) -> dict[str, dict]:
    """``[ddp.NAME]`` tables, each checked field by field (the arm is made in `validate`).

    The module is not imported here: the harness never runs it, and `report`
    reads the spec back on machines that may not have it. A module the
    workers cannot import fails the unit's first worker in one line.
    """
    if not isinstance(tables, dict):
        raise SpecError(DDP, "expected a table of DDP arms",
                        "write each as [ddp.NAME] with backend = \"...\"")
    out = {}
    for name, table in tables.items():
        where = f"{DDP}.{name}"
        if not isinstance(table, dict):
            raise SpecError(where, "expected a table", f"write it as [{where}]")
        for key, value in table.items():
            if key not in DDP_FIELDS:
                raise SpecError(f"{where}.{key}", "unknown field",
                                f"remove it; known fields: {', '.join(DDP_FIELDS)}")
            _, rule, fix = DDP_FIELDS[key]
            check_type(f"{where}.{key}", value, str)
            if not rule.match(value):
                raise SpecError(f"{where}.{key}", f"{value!r} is not a {key} name", f"write {fix}")
        for key, (required, _, fix) in DDP_FIELDS.items():
            if required and key not in table:
                raise SpecError(f"{where}.{key}", "missing", f"write {fix}")
        out[name] = dict(table)
    return out


def register_ddp_backends(tables: dict[str, dict]) -> None:
    """Register each ``[ddp.NAME]`` section as an arm (`register_ddp_backend`)."""
    for name, table in tables.items():
        where = f"{DDP}.{name}"
        if not NAME_RE.match(name):
            raise SpecError(where, f"{name!r} is not a plain name",
                            "name the arm with letters, digits, '.', '_' or '-'")
        try:
            register_ddp_backend(name, table["backend"], table.get("module"))
        except ValueError as exc:
            # "arm 'NAME': why; fix" (the arm's refusal) or "why; fix" (a taken name).
            problem, _, fix = str(exc).removeprefix(f"arm {name!r}: ").partition("; ")
            if "another name" in fix:
                raise SpecError(where, problem, "rename the DDP arm") from None
            raise SpecError(f"{where}.backend", problem, fix or "name another backend") from None
