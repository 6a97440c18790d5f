"""`LazyGroup`: a ``click.Group`` whose commands are imported when they are used.

Why: every ``dblp-testbed`` process imported every command's module first,
and with them pandas (the analysis), so a ``clean`` or a ``burst`` paid for
the analysis it never runs; the test suite starts hundreds of these. A
command here is named by ``"module:attribute"`` and imported only when it is
invoked (or its own ``--help`` is asked for). The group's help lists each
command's first docstring line read from its module's source, so the help
screen imports none of them either; the command's docstring stays the one
place its help lives.

Every group of the command line is one (a group without ``lazy`` commands
too), because resolving a command is also where the old ``--json FILE``
spelling is rewritten before the command parses its words
(`testbed.output.legacy_json_args`).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from functools import cache

import click

from testbed.output import has_json_option, legacy_json_args


@cache
def _docstrings(module: str) -> dict[str, str]:
    """{function name: docstring} of ``module``'s top-level functions, from its source."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return {}
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), spec.origin)
    return {node.name: ast.get_docstring(node) or "" for node in tree.body
            if isinstance(node, ast.FunctionDef) and not any(
                isinstance(d, ast.Call) and _decorator_name(d) in ("command", "group")
                and {k.arg for k in d.keywords} & {"help", "short_help"} for d in node.decorator_list)}


def _decorator_name(call: ast.Call) -> str | None:
    """``command`` for ``@click.command(...)`` and ``@net.command(...)``, ``group`` alike."""
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


class LazyGroup(click.Group):
    """A group whose ``lazy`` commands ({name: "module:attribute"}) load on first use."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx):
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx, name):
        if name not in self.commands and name in self.lazy:
            module, _, attr = self.lazy[name].partition(":")
            cmd = getattr(importlib.import_module(module), attr)
            if cmd.name != name:
                raise RuntimeError(f"{self.lazy[name]} is the command {cmd.name!r}, registered as {name!r}")
            self.add_command(cmd, name)
        return self.commands.get(name)

    def resolve_command(self, ctx, args):
        """click's lookup; a command with ``--json`` gets its old spelling rewritten first."""
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and not isinstance(cmd, click.Group) and has_json_option(cmd):
            rest = legacy_json_args(rest)
        return name, cmd, rest

    def listed_help(self, name: str, limit: int = 45) -> str:
        """A command's line in the group's help: for one not loaded yet, from its source.

        A command whose help is not its function's docstring (``help=``,
        ``short_help=``, or a function the source does not show) is loaded instead.
        """
        if name not in self.commands:
            module, _, attr = self.lazy[name].partition(":")
            doc = _docstrings(module).get(attr)
            if doc:  # shortened by click's own rule, as for the loaded command
                return click.Command(name, help=doc).get_short_help_str(limit)
        cmd = self.get_command(None, name)
        return cmd.get_short_help_str(limit) if cmd is not None else ""

    def format_commands(self, ctx, formatter):
        """click's listing, with each line from `listed_help` (nothing imported for it)."""
        names = [n for n in self.list_commands(ctx)
                 if n not in self.commands or not self.commands[n].hidden]
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        with formatter.section("Commands"):
            formatter.write_dl([(n, self.listed_help(n, limit)) for n in names])
