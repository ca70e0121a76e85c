"""A model directory's tokenizer (``tokenizer.json``) and chat template
(``tokenizer_config.json``): untrusted files, read with size limits and errors naming them;
the template renders in a sandbox."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from interlock.app.outputs import Message
from interlock.core.errors import InputError, ModelError
from interlock.core.files import FileProblem, decode_utf8, read_json, read_regular
from interlock.core.terminal import shown

#: A tokenizer.json larger than this is refused unread (large vocabularies are ~20 MB).
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024


class TextCodec:
    """A ``tokenizers.Tokenizer`` behind the checks its callers need: text must be UTF-8,
    ids must be in the vocabulary, and a failure inside the Rust library (a panic, which
    ``pyo3`` raises as a BaseException that escapes ``except Exception``, e.g. on a
    pre-tokenizer regex that backtracks) is a ModelError naming tokenizer.json."""

    def __init__(self, tokenizer: Tokenizer, path: Path) -> None:
        self.tokenizer = tokenizer
        self.path = path
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True, *, name: str = "prompt") -> Any:
        """``tokenizers.Encoding`` of ``text`` (``.ids``: the token ids)."""
        from interlock.app.arguments import check_text

        if not isinstance(text, str):
            raise InputError(f"{name}: expected text, got {type(text).__name__}")
        check_text(name, text)
        return self._guarded(
            lambda: self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        )

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = list(token_ids)
        for i in ids:
            if type(i) is not int or not 0 <= i < self.vocab_size:
                raise InputError(
                    f"token id {i!r} is invalid; allowed: an integer in 0..{self.vocab_size - 1}"
                )
        return self._guarded(
            lambda: self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        )

    def __getattr__(self, name: str) -> Any:
        # The rest of tokenizers.Tokenizer (token_to_id, get_vocab_size, ...) as it is.
        return getattr(self.tokenizer, name)

    def _guarded(self, work: Any) -> Any:
        try:
            return work()
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise ModelError(
                f"{self.path}: the tokenizer failed: {type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:300]}"
            ) from None


def load_tokenizer(directory: Path | None) -> TextCodec | None:
    """The directory's ``tokenizer.json`` (None when there is none, or no directory)."""
    path = None if directory is None else directory / "tokenizer.json"
    if path is None or not os.path.lexists(path):
        return None
    try:
        text = decode_utf8(read_regular(path, MAX_TOKENIZER_BYTES), str(path))
        return TextCodec(Tokenizer.from_str(text), path)
    except FileProblem as exc:
        raise ModelError(f"cannot read the tokenizer: {exc}") from None
    except BaseException as exc:  # a bare Exception for a file it cannot parse, or a panic
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise ModelError(
            f"{path}: not a tokenizer the `tokenizers` library can load: "
            f"{' '.join(str(exc).split())[:300]}"
        ) from None


class ChatTemplate:
    """A model's Jinja chat template, rendered in a bounded sandbox
    (:mod:`interlock.app.template_sandbox`): the template comes from the model's files, so
    it may not reach Python objects beyond the values given to it, nor run past a time or
    size bound. Any failure while rendering is a ModelError (exit 4) naming the file."""

    def __init__(self, source: str, special_tokens: Mapping[str, str], origin: str) -> None:
        from jinja2 import TemplateError

        from interlock.app.template_sandbox import BoundedSandbox

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        self.environment = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
        self.environment.globals["raise_exception"] = raise_exception
        self.origin = origin
        self.special_tokens = dict(special_tokens)
        try:
            self.template = self.environment.from_string(source)
        except (TemplateError, RecursionError, MemoryError, ValueError, TypeError) as exc:
            raise ModelError(
                f"{origin}: chat_template is not a valid template: {_brief(exc)}"
            ) from None

    def render(self, messages: Sequence[Message]) -> str:
        from interlock.app.template_sandbox import render_bounded

        for i, message in enumerate(messages):
            if not (isinstance(message, Mapping) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise InputError(
                    f"message {i} is {shown(repr(message))}; a message is a mapping with "
                    "string 'role' and 'content'"
                )
        try:
            return render_bounded(
                self.template, self.environment, messages=[dict(m) for m in messages],
                add_generation_prompt=True, **self.special_tokens,
            )
        except Exception as exc:  # noqa: BLE001 - whatever the template raises is its fault
            raise ModelError(f"{self.origin}: chat_template failed: {_brief(exc)}") from None


def _brief(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= 300 else text[:300] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_chat_template(directory: Path | None) -> ChatTemplate | None:
    """The chat template of ``tokenizer_config.json`` (None when there is none)."""
    path = None if directory is None else directory / "tokenizer_config.json"
    if path is None or not path.is_file():
        return None
    try:
        config = read_json(path, MAX_TOKENIZER_BYTES)
    except FileProblem as exc:
        raise ModelError(f"cannot read the chat template: {exc}") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if template is None:
        return None
    if not isinstance(template, str):
        raise ModelError(f"{path}: chat_template must be a string (one template)")
    special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
    return ChatTemplate(template, special, str(path))
