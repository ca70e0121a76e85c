"""A GGUF file's tokenizer: the ``tokenizer.ggml.*`` fields as a ``tokenizers`` byte-level
BPE tokenizer and the tokenizer_config.json contents (special tokens, the chat template)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from interlock.runners.model.gguf.errors import GGUFError
from interlock.runners.model.gguf.reader import Fields

#: Pre-tokenizer regexes by ``tokenizer.ggml.pre``, applied in order (each splits the
#: pieces the previous one left), as the model families' own tokenizers split text.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PRE_TOKENIZERS: Mapping[str, tuple[str, ...]] = {
    "default": (_GPT2_SPLIT,),
    "gpt-2": (_GPT2_SPLIT,),
    "smollm": (r"\p{N}", _GPT2_SPLIT),
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "llama-bpe": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
}
#: GGUF token types (llama.cpp's ``llama_token_type``) that become added tokens.
_CONTROL, _USER_DEFINED = 3, 4


#: A token or merge longer than this is refused (real ones are a few dozen bytes).
MAX_TOKEN_CHARS = 1 << 12
_IDS = ("bos_token_id", "eos_token_id", "eot_token_id", "unknown_token_id",
        "padding_token_id")
_FLAGS = ("add_bos_token", "add_eos_token")


def tokenizer_fields(fields: Fields) -> dict[str, Any]:
    """The tokenizer metadata, each key type-checked (a string ``"false"`` is not False, a
    float or bool is not a token id): a wrong type is a GGUFError naming
    ``tokenizer.ggml.KEY``."""
    keys = ("model", "pre", "tokens", "merges", "token_type", *_IDS, *_FLAGS)
    found = {key: fields.get(f"tokenizer.ggml.{key}") for key in keys}
    found["chat_template"] = fields.get("tokenizer.chat_template")
    found = {key: value for key, value in found.items() if value is not None}
    path = fields.path

    def bad(key: str, value: object, allowed: str) -> GGUFError:
        name = "tokenizer.chat_template" if key == "chat_template" else f"tokenizer.ggml.{key}"
        text = repr(value)
        text = text if len(text) <= 60 else f"{text[:60]}…"
        return GGUFError(f"{path}: metadata {name}={text} is not {allowed}")

    for key in ("model", "pre", "chat_template"):
        if key in found and not isinstance(found[key], str):
            raise bad(key, found[key], "a string")
    for key in ("tokens", "merges"):
        value = found.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise bad(key, value, "an array of strings")
        longest = max(value, key=len, default="")
        if len(longest) > MAX_TOKEN_CHARS:
            raise bad(key, f"<an entry of {len(longest)} characters>",
                      f"entries of at most {MAX_TOKEN_CHARS} characters")
    types = found.get("token_type")
    if types is not None:
        if not isinstance(types, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in types
        ):
            raise bad("token_type", types, "an array of integers")
        count = len(found.get("tokens", ()))
        if len(types) != count:
            raise bad("token_type", f"<{len(types)} entries>",
                      f"one entry per token ({count}, tokenizer.ggml.tokens)")
    for key in _IDS:
        value = found.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise bad(key, value, "a token id (an integer)")
    for key in _FLAGS:
        if key in found and not isinstance(found[key], bool):
            raise bad(key, found[key], "a bool")
    return found


def build_tokenizer(fields: Mapping[str, Any], path: Path) -> tuple[Any, dict[str, Any]]:
    """``(tokenizer, tokenizer_config)``: a byte-level BPE ``tokenizers.Tokenizer`` from the
    GGUF vocabulary and merges (``fields``: :func:`tokenizer_fields` of the file ``path``),
    and the tokenizer_config.json contents (special tokens, whether to add BOS, the chat
    template)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    kind = fields.get("model")
    if kind != "gpt2":
        raise GGUFError(
            f"{path}: tokenizer model {kind!r} (tokenizer.ggml.model) is not supported; "
            "supported: gpt2 (byte-level BPE)"
        )
    pre = fields.get("pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(
            f"{path}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; supported: "
            + ", ".join(PRE_TOKENIZERS)
        )
    tokens = fields.get("tokens")
    if not tokens:
        raise GGUFError(f"{path}: metadata tokenizer.ggml.tokens is missing")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFError(f"{path}: tokenizer.ggml.tokens lists a token twice")
    merges = []
    for i, merge in enumerate(fields.get("merges", [])):
        pair = merge.split(" ")
        if len(pair) != 2:
            raise GGUFError(f"{path}: tokenizer.ggml.merges[{i}]={merge!r} is not 'left right'")
        unknown = [part for part in (*pair, "".join(pair)) if part not in vocab]
        if unknown:
            raise GGUFError(
                f"{path}: tokenizer.ggml.merges[{i}]={merge!r} names {unknown[0]!r}, which is "
                "not in tokenizer.ggml.tokens"
            )
        merges.append((pair[0], pair[1]))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in PRE_TOKENIZERS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    types = fields.get("token_type", [])
    tokenizer.add_tokens(
        [AddedToken(tokens[i], normalized=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    )
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False)
         for i, t in enumerate(types) if t == _CONTROL]
    )

    def token(key: str) -> str | None:
        index = fields.get(key)
        if index is None:
            return None
        if not 0 <= index < len(tokens):
            raise GGUFError(f"{path}: tokenizer.ggml.{key}={index} is outside the vocabulary")
        return tokens[index]

    bos = token("bos_token_id")
    add_bos = fields.get("add_bos_token", False) is True and bos is not None
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, int(fields["bos_token_id"]))],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    config: dict[str, Any] = {
        "add_bos_token": add_bos,
        "bos_token": bos,
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
    }
    if "chat_template" in fields:
        config["chat_template"] = fields["chat_template"]
    return tokenizer, config
