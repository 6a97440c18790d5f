"""`RegistryChoice`: a ``click.Choice`` over a registry's names, read each time it is used.

Why not ``click.Choice(list(REGISTRY))``: that copies the names when the
command is defined, so a kind, topology or arm registered afterwards (a
researcher's own, imported before the command runs) would be refused.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import click


class RegistryChoice(click.Choice):
    """The names of ``registry`` (optionally through ``order``, e.g. ``sorted``), live."""

    def __init__(self, registry: Mapping, order: Callable[[Iterable[str]], Iterable[str]] = tuple):
        self.registry, self.order = registry, order
        super().__init__(tuple(order(registry)))

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        return tuple(self.order(self.registry))

    @choices.setter
    def choices(self, value) -> None:
        """click's constructor sets a copy; the registry stays the source."""
