"""The OpenAI request bodies the server takes, checked, and the JSON it answers with.

The protocol's own fields (``model``, ``prompt``/``messages``, ``stream``, ...) are read
by pydantic, strictly; every other field is a sampling field and goes to
``SamplingParams`` as it is, which takes vLLM's names, types and ranges and refuses any
field it does not implement by name. ``null`` for a sampling field means "not given".
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError

from interlock.core.errors import InputError
from interlock.runners.contract import SampleLogprobs
from interlock.runners.engine.sampling import SamplingParams


class RequestError(InputError):
    """A request the server refuses: the OpenAI error's status, type, param and code."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param,
                          "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr
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


def _sampling(extra: dict[str, Any], defaults: dict[str, Any]) -> SamplingParams:
    given = {k: v for k, v in extra.items() if v is not None}
    try:
        return SamplingParams(**{**defaults, **given})
    except InputError as exc:
        name = next((k for k in given if f"{k}=" in str(exc) or repr(k) in str(exc)), None)
        raise RequestError(str(exc), param=name) from None


def parse_completion(body: object, served: Sequence[str]) -> Parsed:
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
    # The OpenAI default for completions: 16 tokens.
    params = _sampling(request.model_extra or {}, {"max_tokens": 16})
    return Parsed(prompts, [], params, request.stream, _usage(request))


def parse_chat(body: object, served: Sequence[str]) -> Parsed:
    request = _validated(ChatBody, body)
    check_model(request.model, served)
    messages = []
    for i, message in enumerate(request.messages):
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
    extra = dict(request.model_extra or {})
    if request.max_completion_tokens is not None:
        if extra.get("max_tokens") is not None:
            raise RequestError("give max_tokens or max_completion_tokens, not both",
                               param="max_completion_tokens")
        extra["max_tokens"] = request.max_completion_tokens
    if request.top_logprobs is not None and not request.logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    if request.logprobs:
        extra["logprobs"] = request.top_logprobs or 0
    # Chat's default: as many tokens as the context leaves (vLLM's).
    params = _sampling(extra, {"max_tokens": None})
    return Parsed([], messages, params, request.stream, _usage(request))


def _usage(request: _Common) -> bool:
    if request.stream_options is not None and not request.stream:
        raise RequestError("stream_options needs stream=true", param="stream_options")
    return bool(request.stream_options and request.stream_options.include_usage)


def check_model(name: str, served: Sequence[str]) -> None:
    if name not in served:
        raise RequestError(
            f"the model {name!r} is not served here; this server serves: {', '.join(served)}",
            param="model", code="model_not_found",
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
