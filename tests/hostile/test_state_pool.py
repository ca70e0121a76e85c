"""The recurrent-state pool of a linear-attention model, third hostile pass (issue 38): it
is counted with the KV cache against the memory available before anything is allocated."""

from __future__ import annotations

from typing import Any

import pytest
from tiny_models import TINY_CONFIGS

from interlock.app.arguments import check_kv_cache_fits
from interlock.core.errors import InputError
from interlock.runners.batching.kv_cache import KVCacheError, plan_kv_cache
from interlock.runners.contract import ModelSpec
from interlock.runners.model import memory
from interlock.runners.model.cache_spec import state_pool_bytes
from interlock.runners.model.config_json import parse_config

_, ARCH, EXTRA = TINY_CONFIGS["kimi_linear"]
KIMI: dict[str, Any] = {
    "architectures": [ARCH], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
    "num_attention_heads": 4, "max_position_embeddings": 64, **EXTRA,
}


def _spec(max_num_seqs: int) -> ModelSpec:
    return ModelSpec(name="kimi", config=parse_config(KIMI), dtype="float32", device="cpu",
                     max_model_len=64, max_num_seqs=max_num_seqs)


def test_the_state_pool_counts_against_available_memory(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(max_num_seqs=4096)
    pool = state_pool_bytes(spec.config, 4, spec.max_num_seqs)
    monkeypatch.setattr(memory, "available_bytes", lambda device: pool // 2)
    with pytest.raises(InputError, match=r"max_num_seqs=4096 is invalid; allowed: a "
                       r"recurrent-state pool that fits in memory"):
        check_kv_cache_fits(spec, num_blocks=2, block_size=4)


def test_a_pool_that_fits_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(max_num_seqs=4)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1 << 30)
    check_kv_cache_fits(spec, num_blocks=2, block_size=4)


def test_a_budget_the_pool_fills_names_the_pool() -> None:
    spec = _spec(max_num_seqs=4096)
    pool = state_pool_bytes(spec.config, 4, spec.max_num_seqs)
    with pytest.raises(KVCacheError, match="the recurrent-state pool of 4096 sequences"):
        plan_kv_cache(spec, 4, kv_cache_memory=pool)
