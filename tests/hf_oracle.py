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


def transformers_replay(
    model, prompt: Sequence[int], steps: Sequence[tuple[int, int]]
) -> list[int]:
    """Greedy decoding with transformers' forward fed as a runner fed one request:
    ``steps`` are its (start_position, token count) per engine step, in order (prefill
    chunks, then one token per decode step; a start of 0 again after a preemption
    recomputes from a fresh cache). A step that reaches the end of the tokens so far
    samples the next. Chunking is part of the oracle because it changes transformers' own
    tokens where the DSA indexer's scores tie: ``torch.topk`` on the CPU breaks ties by
    the whole row, and a chunk's rows end where the chunk does."""
    import torch

    tokens = list(prompt)
    generated: list[int] = []
    cache = None
    with torch.no_grad():
        for start, count in steps:
            if start == 0:
                cache = None
            cached = 0 if cache is None else cache.get_seq_length()
            if cached != start or start + count > len(tokens):
                raise ValueError(f"step ({start}, {count}) does not follow the steps before "
                                 f"it ({cached} tokens cached of {len(tokens)})")
            out = model(input_ids=torch.tensor([tokens[start:start + count]]), cache=cache,
                        use_cache=True)
            cache = out.past_key_values
            if start + count == len(tokens):
                token = int(out.logits[0, -1].argmax())
                tokens.append(token)
                generated.append(token)
    return generated
