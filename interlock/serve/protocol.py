"""The OpenAI request bodies the server takes, checked, and the JSON it answers with.

The protocol's own fields (``model``, ``prompt``/``messages``, ``stream``, ...) are read
by pydantic, strictly; every other field is a sampling field and goes to
``SamplingParams`` as it is, which takes vLLM's names, types and ranges and refuses any
field it does not implement by name. ``null`` for a sampling field means "not given".

Everything a request can cost is bounded here, before any prompt is tokenized or any
engine request is built (:class:`Limits`): the completions it asks for (``n`` times its
prompts), the size of its prompts, and the alternatives per token (``logprobs``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError

from interlock.core.errors import InputError
from interlock.runners.batching.sampling import (
    SUPPORTED_FIELDS,
    UNSUPPORTED_VLLM_FIELDS,
    SamplingParams,
)
from interlock.runners.contract import SampleLogprobs
from interlock.serve import MAX_LOGPROBS

#: Request fields of the OpenAI API (or of vLLM's server) that ask for more than plain text:
#: refused as unsupported by this server, not as unknown.
UNSUPPORTED_REQUEST_FIELDS = (
    "response_format", "tools", "tool_choice", "functions", "function_call",
    "parallel_tool_calls", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "chat_template", "chat_template_kwargs",
)


class RequestError(InputError):
    """A request the server refuses: the OpenAI error's status, type and param; its
    ``code`` is the status, as vLLM's server sends it."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.type, self.param = status, type, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param,
                          "code": self.status}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, checked before anything is tokenized or built.

    ``completions``: ``n`` times the prompts at most (the requests the server admits at
    once: more could never be admitted). ``prompt_tokens``: token ids in a prompt (the
    model length). ``prompt_chars``: characters in a text prompt, or in a conversation's
    messages together: more than ``prompt_tokens`` tokens could hold, so it could never
    fit. ``logprobs``: alternatives per token. ``defaults``: the model's own sampling
    defaults (its generation config), under what the request gives."""

    completions: int
    prompt_tokens: int
    prompt_chars: int
    logprobs: int = MAX_LOGPROBS
    defaults: dict[str, Any] = field(default_factory=dict)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr | None = None  # the served model when absent, as vLLM's server does
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None  # the caller's end user, for their own logs: not used


class CompletionBody(_Common):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    echo: StrictBool = False
    suffix: StrictStr | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: StrictStr
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr | list[TextPart] | None = None


class ChatBody(_Common):
    messages: list[ChatMessage]
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None


class TokenizeBody(BaseModel):
    """vLLM's ``/tokenize`` body: a ``prompt``, or chat ``messages``."""

    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None
    tokens: list[StrictInt]


@dataclass(frozen=True)
class Tokenize:
    prompt: str | None
    messages: list[dict[str, str]] | None
    add_special_tokens: bool
    return_token_strs: bool


#: The fields that take one of several forms, and those forms.
UNION_FORMS = {
    "prompt": "a string, a list of strings, a list of token ids, or a list of token-id lists",
    "content": "a string, or a list of text parts ({\"type\": \"text\", \"text\": ...})",
}


@dataclass(frozen=True)
class Parsed:
    """A request body, checked: its prompts (completions) or its conversation (chat), one
    sampling configuration, how to answer."""

    prompts: list[str | list[int]]
    messages: list[dict[str, str]]
    params: SamplingParams
    stream: bool
    include_usage: bool
    #: ``max_tokens`` came from the defaults, not the request: it is cut to the context a
    #: prompt leaves (vLLM's), where a given one past it is refused.
    default_max_tokens: bool = False


def _validated(model: type[BaseModel], body: object) -> Any:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = list(first["loc"])
        # A union's error names the member it tried last ("prompt.str"): say every form.
        for name, forms in UNION_FORMS.items():
            if name in loc:
                field = ".".join(map(str, loc[: loc.index(name) + 1]))
                raise RequestError(f"{field}: expected {forms}", param=field) from None
        where = ".".join(map(str, loc)) or None
        raise RequestError(f"{where}: {first['msg']}" if where else first["msg"],
                           param=where) from None


def _sampling(extra: dict[str, Any], endpoint: dict[str, Any], limits: Limits,
              prompts: int) -> tuple[SamplingParams, bool]:
    """The request's sampling fields over the defaults (the endpoint's ``endpoint``, over
    the model's, over as many tokens as the context leaves), checked against ``limits``
    before anything larger than the body is built; and whether ``max_tokens`` is a
    default."""
    given = {k: v for k, v in extra.items() if v is not None}
    for name in given:
        if name in UNSUPPORTED_REQUEST_FIELDS:
            raise RequestError(f"{name}: interlock's server does not support it (it answers "
                               "with plain text)", param=name)
        if name not in SUPPORTED_FIELDS and name not in UNSUPPORTED_VLLM_FIELDS:
            raise RequestError(f"unknown field {name!r}: interlock's server does not take it; "
                               f"its sampling fields: {', '.join(SUPPORTED_FIELDS)}",
                               param=name)
    n = given.get("n", 1)
    if type(n) is int and n * prompts > limits.completions:
        what = f"n={n} for {prompts} prompts" if prompts > 1 else f"n={n}"
        raise RequestError(f"{what} asks for {n * prompts} completions; this server admits "
                           f"at most {limits.completions} at once (--max-num-seqs plus "
                           "--max-queue)", param="n" if n > 1 else "prompt")
    try:
        params = SamplingParams(**{"max_tokens": None, **limits.defaults, **endpoint,
                                   **given})
    except InputError as exc:
        named = next((k for k in given if f"{k}=" in str(exc) or repr(k) in str(exc)), None)
        raise RequestError(str(exc), param=named) from None
    return params, "max_tokens" not in given


def _check_logprobs(name: str, value: int | None, limits: Limits) -> None:
    if value is not None and type(value) is int and value > limits.logprobs:
        raise RequestError(f"{name}={value} is more than this server returns: at most "
                           f"{limits.logprobs} (--max-logprobs)", param=name)


def _check_prompt_chars(name: str, chars: int, limits: Limits) -> None:
    if chars > limits.prompt_chars:
        raise RequestError(
            f"{name} has {chars} characters, more than {limits.prompt_tokens} tokens (the "
            f"model length) can hold ({limits.prompt_chars}); shorten it", param=name)


def parse_completion(body: object, served: Sequence[str], limits: Limits) -> Parsed:
    request = _validated(CompletionBody, body)
    check_model(request.model, served)
    if request.echo:
        raise RequestError("echo=true is not supported: the answer holds the completion only",
                           param="echo")
    if request.suffix is not None:
        raise RequestError("suffix is not supported (no insertion completions)",
                           param="suffix")
    prompt = request.prompt
    prompts: list[str | list[int]]
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise RequestError("prompt is empty", param="prompt")
    extra = request.model_extra or {}
    _check_logprobs("logprobs", extra.get("logprobs"), limits)
    # The OpenAI default for completions, over the model's: 16 tokens (vLLM's too).
    params, default_max = _sampling(extra, {"max_tokens": 16}, limits, len(prompts))
    for i, one in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt.{i}"
        if isinstance(one, str):
            _check_prompt_chars(where, len(one), limits)
        elif len(one) > limits.prompt_tokens:
            raise RequestError(f"{where} has {len(one)} token ids, more than max_model_len "
                               f"{limits.prompt_tokens}", param=where)
    return Parsed(prompts, [], params, request.stream, _usage(request), default_max)


def _messages(given: list[ChatMessage], limits: Limits) -> list[dict[str, str]]:
    messages = []
    for i, message in enumerate(given):
        content = message.content
        if isinstance(content, list):
            odd = [p.type for p in content if p.type != "text"]
            if odd:
                raise RequestError(f"messages[{i}].content: part type {odd[0]!r} is not "
                                   "supported; allowed: text", param=f"messages.{i}.content")
            content = "".join(p.text for p in content)
        messages.append({"role": message.role, "content": content or ""})
    if not messages:
        raise RequestError("messages is empty", param="messages")
    _check_prompt_chars("messages", sum(len(m["role"]) + len(m["content"]) for m in messages),
                        limits)
    return messages


def parse_tokenize(body: object, served: Sequence[str], limits: Limits) -> Tokenize:
    request = _validated(TokenizeBody, body)
    check_model(request.model, served)
    if (request.prompt is None) == (request.messages is None):
        raise RequestError("give prompt or messages (one of them)", param="prompt")
    if request.messages is not None:
        if not request.add_generation_prompt:
            raise RequestError("add_generation_prompt=false is not supported: chat renders "
                               "the assistant's turn", param="add_generation_prompt")
        if request.add_special_tokens:
            raise RequestError("add_special_tokens=true is not supported with messages: the "
                               "chat template writes them", param="add_special_tokens")
        return Tokenize(None, _messages(request.messages, limits), False,
                        request.return_token_strs)
    assert request.prompt is not None
    _check_prompt_chars("prompt", len(request.prompt), limits)
    special = True if request.add_special_tokens is None else request.add_special_tokens
    return Tokenize(request.prompt, None, special, request.return_token_strs)


def parse_detokenize(body: object, served: Sequence[str], limits: Limits) -> list[int]:
    request = _validated(DetokenizeBody, body)
    check_model(request.model, served)
    if len(request.tokens) > limits.prompt_tokens:
        raise RequestError(f"tokens has {len(request.tokens)} ids, more than max_model_len "
                           f"{limits.prompt_tokens}", param="tokens")
    return list(request.tokens)


def parse_chat(body: object, served: Sequence[str], limits: Limits) -> Parsed:
    request = _validated(ChatBody, body)
    check_model(request.model, served)
    messages = _messages(request.messages, limits)
    extra = dict(request.model_extra or {})
    if request.max_completion_tokens is not None:
        if extra.get("max_tokens") is not None:
            raise RequestError("give max_tokens or max_completion_tokens, not both",
                               param="max_completion_tokens")
        extra["max_tokens"] = request.max_completion_tokens
    if request.top_logprobs is not None and not request.logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    _check_logprobs("top_logprobs", request.top_logprobs, limits)
    if request.logprobs:
        extra["logprobs"] = request.top_logprobs or 0
    # Chat's default: the model's max_tokens, else as many as the context leaves (vLLM's).
    params, default_max = _sampling(extra, {}, limits, 1)
    return Parsed([], messages, params, request.stream, _usage(request), default_max)


def _usage(request: _Common) -> bool:
    if request.stream_options is not None and not request.stream:
        raise RequestError("stream_options needs stream=true", param="stream_options")
    return bool(request.stream_options and request.stream_options.include_usage)


def check_model(name: str | None, served: Sequence[str]) -> None:
    """An absent ``model`` is the served one; an unknown one is a 404, as vLLM's server
    answers it."""
    if name is not None and name not in served:
        raise RequestError(
            f"the model {name!r} does not exist here; this server serves: {', '.join(served)}",
            status=404, type="NotFoundError", param="model",
        )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_logprobs(tokens: Sequence[str], steps: Sequence[SampleLogprobs],
                        top: Sequence[dict[str, float]], offset: int) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object for ``tokens`` (their texts) starting at
    text offset ``offset``."""
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {"tokens": list(tokens), "token_logprobs": [s.logprob for s in steps],
            "top_logprobs": list(top), "text_offset": offsets}


def chat_logprobs(tokens: Sequence[str], steps: Sequence[SampleLogprobs],
                  top: Sequence[Sequence[tuple[str, float]]]) -> dict[str, Any]:
    """The chat ``logprobs`` object: per token its text, logprob, UTF-8 bytes and the most
    likely alternatives."""
    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [
        {**entry(text, step.logprob), "top_logprobs": [entry(t, lp) for t, lp in alts]}
        for text, step, alts in zip(tokens, steps, top, strict=True)
    ]}
