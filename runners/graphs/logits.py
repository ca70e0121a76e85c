"""What the built-in runners do to a step's logits around the ``sample`` kernel.

Penalties and min-p change the logits of the rows that ask for them before the kernel
draws (so greedy rows are penalised too, as vLLM does); logprobs are read after it from
the raw logits (vLLM's default, ``raw_logprobs``). Both run in torch, on the rows that ask
only: a batch without them never enters here, and the kernel table's ``sample`` (Triton
or torch) draws every row either way. The runner's report names this step
(``LOGITS_REPORT``), so which code served which request is never silent.
"""

from __future__ import annotations

import math

import torch

from interlock.runners.contract import KernelReport, SampleLogprobs, ScheduledBatch

LOGITS_REPORT = KernelReport(
    "logits_processing",
    "torch (interlock)",
    "repetition, frequency and presence penalties and min_p are applied in torch to the rows "
    "that ask for them before the sample kernel draws, and logprobs are read in torch after "
    "it: no Triton kernel implements them; rows without them go to the sample kernel as is",
)


def needs_processing(batch: ScheduledBatch) -> bool:
    return any(s.sample and (s.sampling.penalised or s.sampling.min_p > 0)
               for s in batch.sequences)


def process_logits(logits: torch.Tensor, batch: ScheduledBatch) -> torch.Tensor:
    """``logits`` [B, V] with each sampling row's penalties and min-p applied (a copy, in
    float32: the raw logits stay for logprobs)."""
    out = logits.float().clone()
    vocab = out.shape[1]
    for row, seq in enumerate(batch.sequences):
        s = seq.sampling
        if not seq.sample:
            continue
        values = out[row]
        if s.repetition_penalty != 1:
            seen = torch.zeros(vocab, dtype=torch.bool, device=out.device)
            seen[_ids(seq.prompt_token_ids + seq.output_token_ids, out.device)] = True
            scaled = torch.where(values > 0, values / s.repetition_penalty,
                                 values * s.repetition_penalty)
            values = torch.where(seen, scaled, values)
        if s.frequency_penalty != 0 or s.presence_penalty != 0:
            counts = torch.bincount(_ids(seq.output_token_ids, out.device), minlength=vocab)
            counts = counts[:vocab].float()
            values = (values - s.frequency_penalty * counts
                      - s.presence_penalty * (counts > 0).float())
        if s.min_p > 0 and s.temperature > 0:
            # p >= min_p * p_max  <=>  logit / T >= max / T + log(min_p)
            floor = values.max() + s.temperature * math.log(s.min_p)
            values = values.masked_fill(values < floor, float("-inf"))
        out[row] = values
    return out


def _ids(tokens: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int64, device=device)


def sample_logprobs(
    logits: torch.Tensor, sampled: list[int], batch: ScheduledBatch
) -> tuple[SampleLogprobs | None, ...]:
    """Per sequence, the logprobs it asks for (None where it asks none or samples nothing),
    from the raw ``logits`` [B, V]; empty when no sequence asks."""
    if not any(s.sample and s.sampling.logprobs >= 0 for s in batch.sequences):
        return ()
    result: list[SampleLogprobs | None] = []
    for row, seq in enumerate(batch.sequences):
        count = seq.sampling.logprobs
        if not seq.sample or count < 0:
            result.append(None)
            continue
        logprobs = torch.log_softmax(logits[row].float(), dim=-1)
        token = sampled[row]
        chosen = logprobs[token]
        rank = int((logprobs > chosen).sum()) + 1
        top = torch.topk(logprobs, min(count, logprobs.shape[0]))
        result.append(SampleLogprobs(
            float(chosen), rank,
            tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True)),
        ))
    return tuple(result)
