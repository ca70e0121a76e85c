"""What reaches a terminal: untrusted text is shown, never obeyed.

Architecture names, config.json values, file names and plugin messages can
hold escape sequences, carriage returns or bidirectional-override characters
that rewrite what a terminal shows. The command line writes its human-facing
output through :class:`EscapingWriter`, which shows every such character as a
Python-style escape (``\\x1b``, ``\\u202e``). JSON output is unaffected:
``json.dumps`` already escapes them.
"""

from __future__ import annotations

import io
import os
import re
from typing import IO

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional and
# zero-width format characters that reorder or hide text.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]"
)
# Colour sequences interlock writes carry this per-process token, which the writer
# removes; any other escape sequence (one read from a file, say) is shown, not obeyed.
_TOKEN = "\ue000" + os.urandom(8).hex() + "\ue001"
_OURS_OR_UNSAFE = re.compile(re.escape(_TOKEN) + "(\x1b\\[[0-9;]*m)|" + _UNSAFE.pattern)


def color(text: str, codes: str) -> str:
    """``text`` in the SGR ``codes`` (``"1;32"``), for output through :class:`EscapingWriter`."""
    return f"{_TOKEN}\x1b[{codes}m{text}{_TOKEN}\x1b[0m"


def _escape_char(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every control, bidi and zero-width character shown as an escape."""
    return _UNSAFE.sub(lambda m: _escape_char(m.group()), text)


def shown(value: str, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for echoing an untrusted value in a
    message (a 60 KB name is not repeated back)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(value)} characters)"


def use_color(stream: IO[str]) -> bool:
    """Colour only on a terminal that shows it: never with NO_COLOR (https://no-color.org)
    or TERM=dumb."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _shown(match: re.Match[str]) -> str:
    return match.group(1) or _escape_char(match.group())


class EscapingWriter(io.TextIOBase):
    """A text stream that escapes what :func:`escape` does before writing to ``stream``,
    letting through only the colour sequences :func:`color` made."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(_OURS_OR_UNSAFE.sub(_shown, text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")
