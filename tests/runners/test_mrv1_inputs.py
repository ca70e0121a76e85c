"""mrv1 input preparation, padding, and the attention split point the graph backends use."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import PROMPTS

from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision, Sampling, ScheduledBatch, ScheduledSequence
from interlock.runners.model.attention import attention_split
from interlock.runners.mrv1.inputs import prepare_host_inputs, to_device


def seq(rid: str, tokens, start: int, table, sample: bool = True) -> ScheduledSequence:
    return ScheduledSequence(rid, tuple(tokens), start, tuple(table), Sampling(), 0, sample)


def test_host_inputs_flatten_a_mixed_batch():
    batch = ScheduledBatch((seq("a", [9], 5, [3, 1]), seq("b", [4, 5, 6], 2, [7])))
    host = prepare_host_inputs(batch, block_size=4)
    assert host.input_ids.tolist() == [9, 4, 5, 6]
    assert host.positions.tolist() == [5, 2, 3, 4]
    assert host.slot_mapping.tolist() == [1 * 4 + 1, 7 * 4 + 2, 7 * 4 + 3, 0 * 4 + 0]
    assert host.block_tables.tolist() == [[3, 1], [7, 0]]
    assert host.seq_lens.tolist() == [6, 5]
    assert host.query_start_loc.tolist() == [0, 1, 4]
    assert host.logits_indices.tolist() == [0, 3]
    assert not host.decode_only


def test_padding_rows_are_inert_and_decode_padding_keeps_one_token_per_row():
    batch = ScheduledBatch((seq("a", [9], 5, [3, 1]), seq("b", [4], 2, [7])))
    host = prepare_host_inputs(batch, block_size=4, num_tokens=4, num_seqs=4, table_width=3)
    assert host.slot_mapping.tolist()[2:] == [-1, -1]
    assert host.seq_lens.tolist() == [6, 3, 0, 0]
    assert host.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert host.block_tables.shape == (4, 3)
    assert host.top_p.tolist() == [1.0] * 4 and host.temperature.tolist() == [0.0] * 4
    assert host.decode_only and (host.num_tokens, host.num_seqs) == (2, 2)
    with pytest.raises(ValueError, match="cannot pad 2 tokens / 2 sequences down to 1 / 2"):
        prepare_host_inputs(batch, block_size=4, num_tokens=1)


@pytest.fixture
def engine(tiny_models):
    llm = LLM(str(tiny_models.path("llama")), block_size=4, num_blocks=64, max_model_len=96,
              decision=Decision())
    return llm.step_loop


def scheduled_batches(engine):
    """A prefill batch, then a mixed batch (decodes plus a new prompt)."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for prompt in PROMPTS[:2]:
        engine.add_request(engine.make_request(prompt, params))
    prefill = engine.scheduler.schedule()
    engine.scheduler.update(engine.runner.execute(prefill), 0.0)
    engine.add_request(engine.make_request(PROMPTS[2], params))
    return engine.scheduler.schedule()


def test_padded_forward_matches_unpadded_and_writes_only_real_slots(engine):
    runner = engine.runner
    mixed = scheduled_batches(engine)
    decode = ScheduledBatch(mixed.sequences[:2])
    for batch in (mixed, decode):
        plain = runner.compute_logits(runner.stage(batch, None)[0])
        host = prepare_host_inputs(batch, runner.block_size, num_tokens=batch.num_tokens + 3,
                                   num_seqs=len(batch.sequences) + 3, table_width=24)
        assert host.decode_only == batch.decode_only == (batch is decode)
        before = [k.flatten(0, 1).clone() for k, _ in runner.kv_caches]
        padded = runner.compute_logits(to_device(host, runner.device)[0])
        torch.testing.assert_close(padded[: len(batch.sequences)], plain, atol=1e-5, rtol=1e-5)
        real_slots = torch.from_numpy(host.slot_mapping[: host.num_tokens])
        untouched = torch.ones(before[0].shape[0], dtype=torch.bool)
        untouched[real_slots] = False
        for old, (k, _) in zip(before, runner.kv_caches, strict=True):
            new = k.flatten(0, 1)
            assert torch.equal(new[untouched], old[untouched])
            torch.testing.assert_close(new[real_slots], old[real_slots], atol=1e-5, rtol=1e-5)


def test_attention_split_point_sees_every_layer_after_the_kv_store(engine):
    runner = engine.runner
    batch = scheduled_batches(engine)
    inputs, _ = runner.stage(batch, None)
    plain = runner.compute_logits(inputs)
    seen = []

    def hook(layer, q, metadata):
        slots = metadata.slot_mapping[metadata.slot_mapping >= 0]
        stored = layer.k_cache.flatten(0, 1)[slots]
        assert stored.abs().sum() > 0, "attention split reached before the KV store"
        seen.append(layer.layer_index)
        return layer.attend(q, metadata)

    with attention_split(hook):
        hooked = runner.compute_logits(inputs)
    assert seen == list(range(engine.model.config.num_layers))
    torch.testing.assert_close(hooked, plain, atol=0, rtol=0)

    with attention_split(lambda layer, q, metadata: torch.zeros_like(q)):
        assert not torch.allclose(runner.compute_logits(inputs), plain)
    assert np.isfinite(plain.numpy()).all()
