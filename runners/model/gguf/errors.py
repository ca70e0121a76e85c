"""The error of every step of reading and converting a GGUF file.

Its own module, below :mod:`.reader` and :mod:`.layout`: the reader checks the layout
before it parses, and both refuse a file with this error.
"""

from __future__ import annotations

from interlock.runners.model.source_error import ModelSourceError


class GGUFError(ModelSourceError):
    """A GGUF file this project cannot convert, naming the file and what is unsupported."""
