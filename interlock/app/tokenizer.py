"""A model directory's tokenizer (``tokenizer.json``) and chat template
(``tokenizer_config.json``): untrusted files, read with size limits and errors naming them;
the template renders in a sandbox."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from interlock.app.outputs import Message
from interlock.core.errors import InputError, ModelError
from interlock.core.files import FileProblem, decode_utf8, read_json, read_regular

#: A tokenizer.json larger than this is refused unread (large vocabularies are ~20 MB).
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024


def load_tokenizer(directory: Path | None) -> Tokenizer | None:
    """The directory's ``tokenizer.json`` (None when there is none, or no directory)."""
    path = None if directory is None else directory / "tokenizer.json"
    if path is None or not os.path.lexists(path):
        return None
    try:
        text = decode_utf8(read_regular(path, MAX_TOKENIZER_BYTES), str(path))
        return Tokenizer.from_str(text)
    except FileProblem as exc:
        raise ModelError(f"cannot read the tokenizer: {exc}") from None
    except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot parse
        raise ModelError(
            f"{path}: not a tokenizer the `tokenizers` library can load: "
            f"{' '.join(str(exc).split())[:300]}"
        ) from None


class ChatTemplate:
    """A model's Jinja chat template, rendered in a sandbox: the template comes from the
    model's files, so it may not reach Python objects beyond the values given to it."""

    def __init__(self, source: str, special_tokens: Mapping[str, str], origin: str) -> None:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = raise_exception
        self.origin = origin
        self.special_tokens = dict(special_tokens)
        try:
            self.template = environment.from_string(source)
        except TemplateError as exc:
            raise ModelError(f"{origin}: chat_template is not a valid template: {exc}") from None

    def render(self, messages: Sequence[Message]) -> str:
        from jinja2 import TemplateError

        for i, message in enumerate(messages):
            if not (isinstance(message, Mapping) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise InputError(
                    f"message {i} is {message!r}; a message is a mapping with string 'role' "
                    "and 'content'"
                )
        try:
            return self.template.render(
                messages=[dict(m) for m in messages], add_generation_prompt=True,
                **self.special_tokens,
            )
        except TemplateError as exc:
            raise ModelError(f"{self.origin}: chat_template failed: {exc}") from None


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
