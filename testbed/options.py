"""Options that several commands share under one name: the link rate, and old names kept hidden.

Why: the link rate was ``--bw`` on `net check` and `bench bursts`,
``--rate-mbit`` on `bench transport` and ``--rate-mbps`` on `report`, three
names for one quantity in one unit. It is ``--rate-mbps`` everywhere now
(`report`'s, the spec's ``topology.bw_mbps`` in the same unit); the old
names still parse, because reference records (`testbed.references`) and
the results pages show commands with them, but neither the help nor shell
completion offers them.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import click


def hidden_alias(dest: str, *names: str) -> Callable[[Callable], Callable]:
    """Accept ``names`` as hidden spellings of the number option whose parameter is ``dest``.

    A hidden option of its own per alias (click has no hidden secondary
    names: an extra name in ``opts`` shows in the help and the completion),
    folded into ``dest`` before the command runs. Giving the option and an
    alias together is refused rather than one silently winning.
    """
    alias_dest = f"_alias_of_{dest}"

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(*args, **kwargs):
            value = kwargs.pop(alias_dest)
            if value is not None:
                ctx = click.get_current_context()
                if ctx.get_parameter_source(dest) not in (click.core.ParameterSource.DEFAULT, None):
                    shown = next(p.opts[0] for p in ctx.command.params if p.name == dest)
                    raise click.UsageError(f"{shown} and its old name {'/'.join(names)} both given: "
                                           f"give {shown} once")
                kwargs[dest] = value
            return f(*args, **kwargs)

        return click.option(*names, alias_dest, hidden=True, type=float, default=None,
                            help=f"Old name of the {dest} option.")(command)
    return decorate


def rate_option(dest: str, default: float, help: str, old_names: tuple[str, ...] = ()) -> Callable:
    """``--rate-mbps``: a link's shaped rate in Mbit/s, as every command names it.

    ``dest`` keeps each command's own parameter name; ``old_names`` are the
    names the command had before (`hidden_alias`).
    """
    def decorate(f: Callable) -> Callable:
        f = click.option("--rate-mbps", dest, type=float, default=default, show_default=True,
                         metavar="MBIT/S", help=help)(f)
        return hidden_alias(dest, *old_names)(f) if old_names else f
    return decorate
