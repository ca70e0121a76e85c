"""Every architecture against transformers on the same weights: tokens, logits, batching."""

from __future__ import annotations

import pytest
import torch
from tiny_models import NEW_TOKENS, PROMPTS, TINY_CONFIGS

from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision

GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)


def make_llm(path, runner=None, **kwargs) -> LLM:
    """Eager mrv1 unless told otherwise: parity with transformers is the subject here."""
    options = {"block_size": 4, "num_blocks": 128, "max_model_len": 128,
               "decision": Decision(), **kwargs}
    return LLM(str(path), dtype="float32", runner=runner, **options)


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_greedy_tokens_and_logits_match_transformers(name, tiny_models, recording_runner):
    oracle = tiny_models.oracle(name)
    runner = recording_runner()
    llm = make_llm(tiny_models.path(name), runner)

    outputs = llm.generate(PROMPTS, GREEDY)

    assert [list(o.token_ids) for o in outputs] == oracle.tokens
    # One prefill step for all prompts, then one decode step per new token.
    assert len(runner.logits) == NEW_TOKENS
    torch.testing.assert_close(runner.logits[0], oracle.logits[0], atol=2e-4, rtol=1e-4)
    for step in (1, NEW_TOKENS // 2, NEW_TOKENS - 1):
        torch.testing.assert_close(runner.logits[step], oracle.logits[step], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_alone_and_together_in_a_continuous_batch_give_the_same_tokens(name, tiny_models):
    path = tiny_models.path(name)
    oracle = tiny_models.oracle(name)
    single = make_llm(path)
    alone = [single.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    assert [list(t) for t in alone] == oracle.tokens

    # Few blocks and a small token budget: chunked prefills, requests waiting for
    # blocks and preemptions, with requests joining between steps.
    llm = make_llm(path, num_blocks=24, max_num_batched_tokens=8)
    engine = llm.step_loop
    pending = [engine.make_request(p, GREEDY) for p in PROMPTS]
    requests = list(pending)
    engine.add_request(pending.pop(0))
    saw_mixed = False
    steps = 0
    while engine.has_unfinished() or pending:
        if pending and steps % 3 == 2:
            engine.add_request(pending.pop(0))
        batch = engine.scheduler.schedule()
        counts = {s.num_tokens for s in batch.sequences}
        saw_mixed |= 1 in counts and any(c > 1 for c in counts)
        engine.scheduler.update(engine.runner.execute(batch), 0.0)
        steps += 1
    assert [tuple(r.output_token_ids) for r in requests] == alone
    assert saw_mixed, "no step mixed a prefill chunk with decodes"
    assert sum(r.num_preemptions for r in requests) > 0, "the cache never ran short"
