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
from typing import IO

# C0 controls but tab and newline, DEL, C1 controls (NEL, U+0085, among them), the line and
# paragraph separators, and the bidirectional and zero-width format characters that reorder
# or hide text. A translation table, not a
# regular expression: compiling one is a measurable part of a warm ``policy explain``.
_UNSAFE = (
    *range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), 0x061C,
    *range(0x200B, 0x2010), 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF,
)
# Colour sequences interlock writes carry this per-process token, which the writer
# removes; any other escape sequence (one read from a file, say) is shown, not obeyed.
_TOKEN = "\ue000" + os.urandom(8).hex() + "\ue001"


def color(text: str, codes: str) -> str:
    """``text`` in the SGR ``codes`` (``"1;32"``), for output through :class:`EscapingWriter`."""
    return f"{_TOKEN}\x1b[{codes}m{text}{_TOKEN}\x1b[0m"


def _escape_char(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_ESCAPES = {code: _escape_char(chr(code)) for code in _UNSAFE}


def escape(text: str) -> str:
    """``text`` with every control, bidi and zero-width character shown as an escape."""
    return text.translate(_ESCAPES)


# Every character str.splitlines() breaks at.
_LINE_BREAKS = {
    code: "\\n" if code == 0x0A else _escape_char(chr(code))
    for code in (0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029)
}


def one_line(text: str) -> str:
    """``text`` with every line break shown as an escape (``\\n``, ``\\u2028``...), for a
    line of output built from untrusted values (an architecture name, a snapshot field, a
    file name), which must not become several lines, such as a spoofed ``runner mrv1`` line.
    Colour sequences pass (the writer escapes the other controls)."""
    return text.translate(_LINE_BREAKS)


def _colour_length(text: str) -> int:
    """The length of the SGR sequence (``ESC [ digits/; m``) ``text`` starts with, or 0."""
    if not text.startswith("\x1b["):
        return 0
    end = 2
    while end < len(text) and text[end] in "0123456789;":
        end += 1
    return end + 1 if end < len(text) and text[end] == "m" else 0


def _escape_except_ours(text: str) -> str:
    """:func:`escape`, letting through the colour sequences :func:`color` made."""
    first, *rest = text.split(_TOKEN)
    out = [escape(first)]
    for part in rest:
        keep = _colour_length(part)
        out.append(part[:keep] + escape(part[keep:]) if keep else escape(_TOKEN + part))
    return "".join(out)


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


class EscapingWriter(io.TextIOBase):
    """A text stream that escapes what :func:`escape` does before writing to ``stream``,
    letting through only the colour sequences :func:`color` made."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(_escape_except_ours(text))
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
