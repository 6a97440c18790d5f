"""A page's marked blocks: finding them, rendering each from its reference, rewriting them.

A page marks each generated table with a pair of comments::

    <!-- reference:default arms -->
    | arm | ... |
    <!-- /reference -->

naming the reference folder (``results/reference/default``) and the table
(a name in `registry.TABLES`). `update` rewrites every marked block from
the files; `stale` lists the blocks whose text differs from what the files
give, which is what the pages' test asserts to be empty.
"""
from __future__ import annotations

import pathlib
import re

from testbed.analysis.pages.registry import TABLES, every_tables
from testbed.errors import InputError
from testbed.references import EVERY

BLOCK_RE = re.compile(r"(<!-- reference:(?P<ref>[\w.-]+) (?P<table>[\w.-]+) -->\n)(?P<body>.*?)"
                      r"(<!-- /reference -->)", re.S)


def render(ref: str, table: str, reference_dir: pathlib.Path) -> str:
    """The markdown of one marked block; a reference without a folder is an InputError."""
    if table not in TABLES:
        raise ValueError(f"README block names table {table!r}; known: {', '.join(TABLES)}")
    if (ref == EVERY) != TABLES[table].every:
        raise ValueError(f"README block {ref} {table}: the tables {', '.join(every_tables())} "
                         f"and only they belong to reference {EVERY!r}")
    folder = reference_dir if ref == EVERY else reference_dir / ref
    if not folder.is_dir():
        raise InputError(f"{folder} does not exist; run `dblp-testbed reproduce {ref}`")
    return TABLES[table].render(folder)


def update(text: str, reference_dir: pathlib.Path, only: tuple[str, ...] = ()) -> str:
    """``text`` with every marked block (of the ``only`` references, if given) rendered afresh."""
    def one(m):
        if only and m["ref"] not in only:
            return m.group(0)
        return m.group(1) + render(m["ref"], m["table"], reference_dir) + m.group(5)
    return BLOCK_RE.sub(one, text)


def stale(text: str, reference_dir: pathlib.Path, only: tuple[str, ...] = ()) -> list[str]:
    """``ref table`` of every marked block whose text is not what the files give."""
    return [f"{m['ref']} {m['table']}" for m in BLOCK_RE.finditer(text)
            if (not only or m["ref"] in only)
            and m["body"] != render(m["ref"], m["table"], reference_dir)]


def blocks(text: str) -> list[tuple[str, str]]:
    """``(ref, table)`` of every marked block, in page order."""
    return [(m["ref"], m["table"]) for m in BLOCK_RE.finditer(text)]
