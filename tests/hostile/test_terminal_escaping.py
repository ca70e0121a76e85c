"""The escaping writer, as a property: whatever text it is given, nothing that can drive a
terminal gets through except the colour sequences interlock itself made (marked with a
per-process random token that text from outside cannot know; a part of it is tried)."""

from __future__ import annotations

import io
import re

from hypothesis import given
from hypothesis import strategies as st

from interlock.core import terminal

UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]"
)
PIECES = st.sampled_from(
    ["a", "é", "\n", "\t", "\x1b", "[", "m", "1", ";", "\x9b", "\u202e", "\u200b", "\ufeff",
     "\x7f", "\x00", terminal._TOKEN[:5], terminal._TOKEN[5:]]
)
# Text from outside never holds the whole token: it is random per process.
TEXT = st.lists(PIECES | st.text(max_size=4)).map("".join).filter(
    lambda text: terminal._TOKEN not in text
)


def written(text: str) -> str:
    out = io.StringIO()
    terminal.EscapingWriter(out).write(text)
    return out.getvalue()


@given(TEXT)
def test_untrusted_text_is_shown_never_obeyed(text: str) -> None:
    shown = written(text)
    assert not UNSAFE.search(shown)
    assert shown == terminal.escape(text)


@given(TEXT, st.sampled_from(["1", "1;32", "0", "31"]))
def test_interlocks_own_colours_get_through_and_nothing_else(text: str, codes: str) -> None:
    shown = written(terminal.color("ok", codes) + text)
    assert shown.startswith(f"\x1b[{codes}mok\x1b[0m")
    assert not UNSAFE.search(shown[len(f"\x1b[{codes}mok\x1b[0m"):])
