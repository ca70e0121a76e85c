"""The oracle of the model tests: transformers' own greedy loop."""

from __future__ import annotations

from collections.abc import Sequence


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
