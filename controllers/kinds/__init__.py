"""The burst kinds, one module each, registered in ``KINDS`` (``controllers.kinds.base``).

Importing this package registers the built-in kinds, in the order the
command line lists them: ``loss``, ``police``, ``congest``. A new kind is
a module with a `BurstKind` subclass plus ``register_kind(ItsClass)``,
imported before a spec names it.
"""
from controllers.kinds.base import KINDS, BurstError, BurstKind, P, Param, Range, register_kind
from controllers.kinds.congest import CongestKind
from controllers.kinds.loss import LossKind
from controllers.kinds.police import PoliceKind

for _kind in (LossKind, PoliceKind, CongestKind):
    register_kind(_kind)

__all__ = ["KINDS", "P", "BurstError", "BurstKind", "Param", "Range", "register_kind",
           "LossKind", "PoliceKind", "CongestKind"]
