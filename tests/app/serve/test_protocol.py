"""``policy serve``'s request checks without a server or a model: what a request may ask for
is bounded before anything is tokenized or built (``logprobs``, ``n`` times the prompts, a
prompt's size), errors have vLLM's shape (an int ``code``, a 404 for an unknown model,
``model`` optional), the model's sampling defaults sit under a request's own fields, and a
field the server does not support is said to be the server's gap, not vLLM's."""

from __future__ import annotations

import pytest

from interlock.serve import MAX_LOGPROBS
from interlock.serve.protocol import (
    Limits,
    RequestError,
    parse_chat,
    parse_completion,
    parse_detokenize,
    parse_tokenize,
)

SERVED = ["smollm2"]
LIMITS = Limits(completions=10, prompt_tokens=100, prompt_chars=1000)
CHAT = [{"role": "user", "content": "hi"}]


def refusal(parse, body: dict, limits: Limits = LIMITS) -> RequestError:
    with pytest.raises(RequestError) as caught:
        parse(body, SERVED, limits)
    return caught.value


def test_logprobs_above_the_bound_are_refused_naming_the_field() -> None:
    assert MAX_LOGPROBS == 20  # vLLM's default
    error = refusal(parse_completion, {"prompt": "hi", "logprobs": 49152})
    assert error.status == 400 and error.param == "logprobs" and "at most 20" in str(error)
    assert parse_completion({"prompt": "hi", "logprobs": 20}, SERVED, LIMITS).params.logprobs == 20
    error = refusal(parse_chat, {"messages": CHAT, "logprobs": True, "top_logprobs": 21})
    assert error.param == "top_logprobs"
    tight = Limits(completions=10, prompt_tokens=100, prompt_chars=1000, logprobs=2)
    assert refusal(parse_completion, {"prompt": "hi", "logprobs": 3}, tight).param == "logprobs"


def test_more_completions_than_the_server_admits_are_refused_at_once() -> None:
    error = refusal(parse_completion, {"prompt": "hi", "n": 300000})
    assert error.status == 400 and error.param == "n"
    assert "admits at most 10" in str(error)
    error = refusal(parse_completion, {"prompt": ["a", "b", "c"], "n": 4})
    assert error.param == "n" and "12 completions" in str(error)
    error = refusal(parse_completion, {"prompt": ["a"] * 11})
    assert error.param == "prompt"
    assert len(parse_completion({"prompt": ["a"] * 5, "n": 2}, SERVED, LIMITS).prompts) == 5


def test_a_prompt_larger_than_the_model_length_can_hold_is_refused_untokenized() -> None:
    error = refusal(parse_completion, {"prompt": "x" * 1001})
    assert error.param == "prompt" and "1001 characters" in str(error)
    error = refusal(parse_completion, {"prompt": ["ok", "x" * 1001]})
    assert error.param == "prompt.1"
    error = refusal(parse_completion, {"prompt": list(range(101))})
    assert error.param == "prompt" and "101 token ids" in str(error)
    error = refusal(parse_chat, {"messages": [{"role": "user", "content": "x" * 1000}]})
    assert error.param == "messages"
    error = refusal(parse_tokenize, {"prompt": "x" * 1001})
    assert error.param == "prompt"
    assert refusal(parse_detokenize, {"tokens": [1] * 101}).param == "tokens"


def test_errors_have_vllms_shape() -> None:
    error = refusal(parse_completion, {"model": "gpt-4", "prompt": "hi"})
    assert error.status == 404 and error.param == "model"
    body = error.body()["error"]
    assert body["type"] == "NotFoundError" and body["code"] == 404
    assert "smollm2" in body["message"]
    assert refusal(parse_completion, {"prompt": 7}).body()["error"]["code"] == 400
    # model is optional: the served one.
    assert parse_completion({"prompt": "hi"}, SERVED, LIMITS).prompts == ["hi"]
    assert parse_chat({"messages": CHAT}, SERVED, LIMITS).messages == CHAT


@pytest.mark.parametrize("field", ["response_format", "tools", "tool_choice"])
def test_unsupported_fields_are_the_servers_gap_not_vllms(field: str) -> None:
    error = refusal(parse_chat, {"messages": CHAT, field: {"type": "json_object"}})
    assert error.param == field
    assert "interlock's server does not support it" in str(error)
    assert "vLLM" not in str(error)
    unknown = refusal(parse_chat, {"messages": CHAT, "frobnicate": 1})
    assert "'frobnicate'" in str(unknown) and "vLLM" not in str(unknown)


def test_the_models_sampling_defaults_sit_under_the_requests_fields() -> None:
    model = Limits(completions=10, prompt_tokens=100, prompt_chars=1000,
                   defaults={"temperature": 0.2, "top_p": 0.9, "max_tokens": 50})
    chat = parse_chat({"messages": CHAT}, SERVED, model)
    assert (chat.params.temperature, chat.params.top_p, chat.params.max_tokens) == (0.2, 0.9, 50)
    assert chat.default_max_tokens
    given = parse_chat({"messages": CHAT, "temperature": 0, "max_tokens": 7}, SERVED, model)
    assert (given.params.temperature, given.params.max_tokens) == (0, 7)
    assert not given.default_max_tokens
    # Completions keep OpenAI's (and vLLM's) 16 over the model's max_tokens.
    assert parse_completion({"prompt": "hi"}, SERVED, model).params.max_tokens == 16
    # Without model defaults, chat runs as long as the context leaves (None).
    assert parse_chat({"messages": CHAT}, SERVED, LIMITS).params.max_tokens is None


def test_tokenize_takes_a_prompt_or_messages() -> None:
    text = parse_tokenize({"prompt": "hi", "return_token_strs": True}, SERVED, LIMITS)
    assert (text.prompt, text.add_special_tokens, text.return_token_strs) == ("hi", True, True)
    chat = parse_tokenize({"model": "smollm2", "messages": CHAT}, SERVED, LIMITS)
    assert chat.messages == CHAT and not chat.add_special_tokens
    assert refusal(parse_tokenize, {"prompt": "a", "messages": CHAT}).param == "prompt"
    assert refusal(parse_tokenize, {"model": "x", "prompt": "a"}).status == 404
    assert parse_detokenize({"tokens": [1, 2]}, SERVED, LIMITS) == [1, 2]
