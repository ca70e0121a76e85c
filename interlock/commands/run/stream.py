"""Text replies written to a terminal as they are generated, in prompt order."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from interlock.commands.run.render import finish_line, header, prompt_label

if TYPE_CHECKING:
    from interlock.llm import LLM
    from interlock.policy.resolution import Resolution


class Stream:
    """Writes the header, then each text prompt's reply as its tokens arrive, in prompt
    order: the first unfinished prompt live, each later one once those before it are done.
    Token-id prompts are shown with the metrics, at the end."""

    def __init__(self, out: TextIO, resolution: Resolution, provider: str,
                 args: argparse.Namespace) -> None:
        self.out, self.resolution, self.provider = out, resolution, provider
        self.first = len(args.prompt_token_ids)
        self.labels = [prompt_label(self.first + i, text, args.chat)
                       for i, text in enumerate(args.prompt)]
        self.tokens: list[tuple[int, ...]] = [()] * len(args.prompt)
        self.reasons: list[str | None] = [None] * len(args.prompt)
        self.turn = 0  # the prompt being shown
        self.shown: str | None = None  # its reply so far on the terminal (None: no label yet)

    def start(self, llm: LLM) -> Callable[[int, tuple[int, ...], str | None], None]:
        """Write the header of the loaded model; returns the ``on_tokens`` callback."""
        self.llm = llm
        self.out.write(header(self.resolution, self.provider, llm.report()) + "\n")
        self.out.flush()
        return self.on_tokens

    def on_tokens(self, index: int, tokens: tuple[int, ...], reason: str | None) -> None:
        index -= self.first
        if index < 0:
            return
        self.tokens[index], self.reasons[index] = tokens, reason
        while self.turn < len(self.tokens):
            i = self.turn
            if self.shown is None:
                self.out.write(self.labels[i] + "\n")
                self.shown = ""
            text = self.llm.decode(self.tokens[i])
            if self.reasons[i] is None:
                # An incomplete UTF-8 sequence decodes to U+FFFD until its last byte arrives.
                text = text.rstrip("\ufffd")
            if text.startswith(self.shown):
                self.out.write(text[len(self.shown):])
                self.shown = text
            if self.reasons[i] is None:
                break
            self.out.write("\n" + finish_line(self.tokens[i], self.reasons[i]) + "\n\n")
            self.turn, self.shown = self.turn + 1, None
        self.out.flush()
