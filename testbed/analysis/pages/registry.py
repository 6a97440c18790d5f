"""Every table a page's marked block can name, registered by the module that renders it.

A renderer takes its reference's folder (``results/reference/NAME``) and
gives the block's markdown; one registered ``every`` reads every reference
at once, from the reference root, and only blocks naming
`testbed.references.EVERY` ("all") may name it. The renderers register
themselves as the references do (`testbed.references.register`): a module
of this package renders a group of tables and registers each under its
block name, so a new table is one renderer and one `register` call in the
module of its kind, and `testbed.analysis.pages.markers` finds it here.
"""
from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable

#: What renders a table: its reference's folder (the reference root for an
#: ``every`` table) -> the block's markdown.
Renderer = Callable[[pathlib.Path], str]


@dataclasses.dataclass(frozen=True)
class Table:
    """One table a block can name: its renderer, and whether it reads every reference."""

    name: str
    render: Renderer
    every: bool = False


#: Every table by the name in its marker, in the order they were registered.
TABLES: dict[str, Table] = {}


def register(name: str, render: Renderer, every: bool = False) -> Table:
    """Register ``render`` as the table ``name``; a name is registered once."""
    if name in TABLES:
        raise ValueError(f"table {name!r} is already registered")
    TABLES[name] = Table(name, render, every)
    return TABLES[name]


def every_tables() -> list[str]:
    """The tables that read several references at once, in the order they were registered."""
    return [name for name, table in TABLES.items() if table.every]
