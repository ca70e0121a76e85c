"""Fixtures of the model-source tests: a private cache directory, and transformers' greedy
loop (the oracle)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> None:
    """GGUF conversions of a test session go to one private cache directory, not the user's."""
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Small models gain nothing from a second thread on a busy two-core machine."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def transformers_greedy(
    model, prompt: Sequence[int], max_tokens: int, eos: Sequence[int] = ()
) -> list[int]:
    """Greedy decoding with transformers' forward and its KV cache, one token per step,
    stopping after an EOS token (a plain loop: ``generate`` options can hide EOS)."""
    import torch

    tokens: list[int] = []
    ids = torch.tensor([list(prompt)])
    cache = None
    with torch.no_grad():
        for _ in range(max_tokens):
            out = model(input_ids=ids, cache=cache, use_cache=True)
            cache = out.past_key_values
            token = int(out.logits[0, -1].argmax())
            tokens.append(token)
            if token in eos:
                break
            ids = torch.tensor([[token]])
    return tokens
