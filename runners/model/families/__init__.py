"""The model families, one module each, found by scanning this package.

A family module defines ``FAMILIES``, a tuple of ``interlock.runners.model.family.Family``
(one per ``architectures[0]`` name it serves). Adding a Llama-shaped family is one
new module here; nothing else lists them.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from interlock.runners.model.family import CheckpointNames, Family


@functools.cache
def registry() -> Mapping[str, Family]:
    """architecture name -> family, from every module of this package (imported once)."""
    found: dict[str, Family] = {}
    where: dict[str, str] = {}
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        families = getattr(module, "FAMILIES", None)
        if not isinstance(families, tuple) or not families:
            raise TypeError(f"{module.__name__} defines no FAMILIES tuple of Family")
        for family in families:
            if family.architecture in found:
                raise TypeError(
                    f"architecture {family.architecture!r} is declared by both "
                    f"{where[family.architecture]} and {module.__name__}"
                )
            found[family.architecture] = family
            where[family.architecture] = module.__name__
    return found


@functools.cache
def gguf_registry() -> Mapping[str, Family]:
    """GGUF ``general.architecture`` name -> the family its files convert to."""
    return {f.gguf.name: f for f in registry().values() if f.gguf is not None}


def family(architecture: str) -> Family | None:
    """The family serving ``architecture``, or None."""
    return registry().get(architecture)


def architectures() -> list[str]:
    return list(registry())


def checkpoint_names(architecture: str) -> CheckpointNames:
    """The checkpoint names of a supported architecture's family."""
    found = family(architecture)
    if found is None:
        raise KeyError(f"architecture {architecture!r} has no family module")
    return found.names
