"""DeepSeek V3.2 and GLM-5 (DSA sparse attention over MLA): token for token with transformers
through every runner and graph mode, with prompts longer than index_topk; the index cache;
the breaks of breakable programs; the configs that are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_models import PROMPTS

from interlock.kernels.native import unavailable as native_unavailable
from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision, KVCacheSpec
from interlock.runners.model.cache_spec import layer_caches
from interlock.runners.model.config import ConfigError
from interlock.runners.model.config_json import load_config
from interlock.runners.model.kv_cache import kv_cache_report

CAPTURE_SIZES = (1, 2, 4, 8)
MAX_TOKENS = [12, 7, 10]
CPU_GRAPHS = "debug" if native_unavailable("cpu") else "native"
MODELS = ["glm_moe_dsa", "deepseek_v32"]
MODES = [("none", False), ("piecewise", False), ("full_and_piecewise", False),
         ("full_and_piecewise", True), ("full", False), ("full_decode_only", False)]


def generate(path: Path, decision: Decision, **engine) -> tuple[list[list[int]], object]:
    options = {"block_size": 4, "num_blocks": 96, "max_model_len": 64, "max_num_seqs": 4,
               "max_num_batched_tokens": 10, **engine}
    llm = LLM(str(path), dtype="float32", decision=decision, **options)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outputs = llm.generate(PROMPTS, params)
    return [list(o.token_ids) for o in outputs], llm.report()


def expected(tiny_models, name: str) -> list[list[int]]:
    oracle = tiny_models.oracle(name).tokens
    return [tokens[:n] for tokens, n in zip(oracle, MAX_TOKENS, strict=True)]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("mode", "breakable"), MODES,
                         ids=[f"{m}{'-breakable' if b else ''}" for m, b in MODES])
@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_every_graph_mode_gives_transformers_tokens(runner, mode, breakable, name, tiny_models):
    decision = Decision(runner, mode, breakable, capture_sizes=CAPTURE_SIZES)
    tokens, report = generate(tiny_models.path(name), decision)

    assert tokens == expected(tiny_models, name)
    graphs = report.graphs
    assert graphs.backend == ("none" if mode == "none" else CPU_GRAPHS)
    # Every op of the indexer, the sparse attention and the MoE goes through the kernel
    # table: nothing fails to capture (a native tape refuses any other torch op).
    assert not graphs.failed and not report.fallbacks
    if mode != "none":
        assert graphs.captured


def test_prompts_are_longer_than_the_selection(tiny_models):
    config = load_config(tiny_models.path("glm_moe_dsa"))
    assert config.dsa is not None and config.dsa.top_k == 4
    assert max(len(p) for p in PROMPTS) > 4 * config.dsa.top_k


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_breakable_programs_break_at_every_top_k_and_sparse_attention(runner, tiny_models):
    """GLM-5's three layers: two run their indexer, the third attends over the second's
    selection; the report names each break."""
    decision = Decision(runner, "full", True, capture_sizes=(2,))
    _, report = generate(tiny_models.path("glm_moe_dsa"), decision)
    graphs = report.graphs
    assert {(g.segments, g.breaks) for g in graphs.captured} == {(4, 3)}
    assert graphs.break_points == (
        "layer 0: DSA index top-4 + sparse attention",
        "layer 1: DSA index top-4 + sparse attention",
        "layer 2: sparse attention over layer 1's top-4",
    )


def test_the_index_cache_holds_one_key_per_token_on_indexer_layers(tiny_models):
    config = load_config(tiny_models.path("glm_moe_dsa"))
    # kv_lora_rank 16 + qk_rope_head_dim 8, and index_head_dim 16 where an indexer runs.
    assert [[(t.name, t.shape) for t in c.tensors] for c in layer_caches(config)] == [
        [("latent", (24,)), ("index", (16,))],
        [("latent", (24,)), ("index", (16,))],
        [("latent", (24,))],
    ]
    assert layer_caches(config, tensor_parallel_size=2) == layer_caches(config)
    report = kv_cache_report(config, "float32", KVCacheSpec(num_blocks=8, block_size=4))
    assert report.layout == "MLA latent + DSA indexer keys"
    assert report.bytes_per_token == (3 * 24 + 2 * 16) * 4


def _edited(tiny_models, tmp_path: Path, name: str, **changes) -> Path:
    model = tmp_path / name
    shutil.copytree(tiny_models.path(name), model)
    raw = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**raw, **changes}))
    return model


@pytest.mark.parametrize(("name", "changes", "message"), [
    ("glm_moe_dsa", {"indexer_types": ["full", "sparse", "full"]},
     r"indexer_types entry='sparse' is not supported; allowed: full, shared"),
    ("glm_moe_dsa", {"indexer_types": ["shared", "full", "full"]},
     r"indexer_types\[0\]='shared' is not supported; allowed: full"),
    ("glm_moe_dsa", {"indexer_types": ["full"]}, r"indexer_types='<1 entries>'"),
    ("glm_moe_dsa", {"indexer_types": None, "index_topk_pattern": "FSX"},
     r"index_topk_pattern letter='X' is not supported"),
    ("deepseek_v32", {"mlp_layer_types": ["dense", "moe"]},
     r"mlp_layer_types entry='moe' is not supported; allowed: dense, sparse"),
    ("deepseek_v32", {"layer_types": ["indexed_attention", "sliding_attention"]},
     r"layer_types entry='sliding_attention' is not supported; allowed: indexed_attention"),
    ("deepseek_v32", {"q_lora_rank": None}, r"q_lora_rank=None is not supported"),
    ("deepseek_v32", {"index_head_dim": 6}, r"index_head_dim=6 is not supported; allowed: an "
     r"even number of at least qk_rope_head_dim=8"),
    ("deepseek_v32", {"topk_method": "greedy"}, r"topk_method='greedy' is not supported"),
    ("deepseek_v32", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     r"rope type='dynamic' is not supported"),
])
def test_configs_transformers_would_run_differently_are_refused(
    name, changes, message, tiny_models, tmp_path
):
    with pytest.raises(ConfigError, match=message):
        load_config(_edited(tiny_models, tmp_path, name, **changes))


def test_glm_derives_indexer_types_as_transformers_does(tiny_models, tmp_path):
    derived = {}
    for changes in ({"index_topk_pattern": "FFS"}, {"index_topk_freq": 3},
                    {"index_topk_freq": 2, "index_skip_topk_offset": 1}):
        model = _edited(tiny_models, tmp_path / str(len(derived)), "glm_moe_dsa",
                        indexer_types=None, **changes)
        dsa = load_config(model).dsa
        assert dsa is not None
        derived[tuple(changes.items())] = dsa.indexer_layers
    assert list(derived.values()) == [(True, True, False), (True, True, False),
                                      (True, False, True)]
