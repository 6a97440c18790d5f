"""What every section of a spec checks alike: the error a field raises, types, plain names.

Its own module so that the modules of a spec's sections (`testbed.config.spec`,
`testbed.config.armtables`) share one error and one type check without
importing each other.
"""
from __future__ import annotations

import math
import re

from testbed.errors import InputError

#: An arm's or a file's plain name.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: A TOML number: an integer or a float.
NUMBER = (int, float)


class SpecError(InputError):
    """A spec field is wrong; the message names it and the fix."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        super().__init__(f"spec field '{field}': {problem}; {fix}")


def type_name(t) -> str:
    if t == NUMBER:
        return "number"
    if isinstance(t, tuple):
        return " or ".join(map(type_name, t))
    return {int: "integer", float: "number", str: "string", bool: "true/false",
            list: "list", dict: "table"}[t]


def check_type(field: str, value, t):
    ok = isinstance(value, t) and not (t is not bool and not (isinstance(t, tuple) and bool in t)
                                       and isinstance(value, bool))
    if not ok:
        raise SpecError(field, f"expected {type_name(t)}, got {value!r}",
                        f"write it as a TOML {type_name(t)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(field, f"{value!r} is not a finite number", "use a finite number")
