"""The error of resolving ``model=`` to a model directory.

Its own module, below both :mod:`interlock.runners.model.sources` (which resolves names and
files) and :mod:`interlock.runners.model.gguf` (which converts the GGUF files it finds): a
GGUF file that cannot be converted is one kind of source that cannot be resolved, and the
converter must not import the resolver that calls it.
"""

from __future__ import annotations

from interlock.core.errors import ModelError


class ModelSourceError(ModelError):
    """A model name or file that cannot be resolved, with what to do about it."""
