"""Checkpoint loading: formats, dtypes, dummy and demo weights, and every kind of mismatch."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from interlock.core.errors import InputError
from interlock.kernels.native import unavailable
from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.runners.model.checkpoint import CheckpointError, write_demo_checkpoint
from interlock.runners.model.config import ConfigError
from interlock.runners.model.layers import Linear

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPT = [3, 14, 15, 92, 65]
EAGER = Decision()  # the checkpoint is the subject here, not the decision


@pytest.fixture
def llama_dir(tiny_models, tmp_path):
    """A private copy of the tiny Llama checkpoint that a test may damage."""
    return shutil.copytree(tiny_models.path("llama"), tmp_path / "llama")


def tokens(path, **kwargs) -> tuple[int, ...]:
    llm = LLM(str(path), num_blocks=16, max_model_len=64, decision=Decision(), **kwargs)
    return llm.generate([PROMPT], GREEDY)[0].token_ids


def rewrite(directory, change) -> None:
    tensors = load_file(directory / "model.safetensors")
    change(tensors)
    save_file(tensors, directory / "model.safetensors")


def test_missing_tensor_is_named_with_its_shape(llama_dir):
    rewrite(llama_dir, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor model\.layers\.1\.mlp\.down_proj"
                       r"\.weight \(expected shape \(64, 96\)\)"):
        tokens(llama_dir)


def test_unexpected_tensor_is_named(llama_dir):
    rewrite(llama_dir, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(3, 2)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor model\.layers\.0\.mlp\.extra"
                       r"\.weight \(shape \(3, 2\)\)"):
        tokens(llama_dir)


def test_misshaped_tensor_names_expected_and_found(llama_dir):
    rewrite(llama_dir, lambda t: t.update({"model.norm.weight": torch.ones(63)}))
    with pytest.raises(CheckpointError,
                       match=r"tensor model\.norm\.weight has shape \(63,\), expected \(64,\)"):
        tokens(llama_dir)


def test_unsupported_architecture_lists_supported_ones(llama_dir):
    config = json.loads((llama_dir / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (llama_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="'GPT2LMHeadModel' is not supported; supported: "
                       r"(\w+, )*LlamaForCausalLM, MistralForCausalLM, "):
        tokens(llama_dir)


def test_bad_dtype_and_load_format_list_allowed_values(llama_dir):
    # LLM's one argument check (interlock.app.arguments) refuses them before any loading
    with pytest.raises(InputError, match="dtype='float64' is invalid; allowed: auto, "
                       "float32, bfloat16, float16"):
        tokens(llama_dir, dtype="float64")
    with pytest.raises(InputError, match="load_format='pt' is invalid; allowed: auto, "
                       "safetensors, dummy"):
        tokens(llama_dir, load_format="pt")


def test_demo_has_no_checkpoint_files():
    with pytest.raises(CheckpointError, match="'demo' model has no checkpoint files"):
        LLM("demo", load_format="safetensors", num_blocks=1)


def test_directory_without_weights_or_config(tmp_path, llama_dir):
    (llama_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights found; expected model.safetensors"):
        tokens(llama_dir)
    with pytest.raises(InputError, match=r"neither 'demo', a named model \(smollm2\)"):
        tokens(tmp_path / "nowhere")


def test_sharded_checkpoint_loads_like_a_single_file(llama_dir):
    expected = tokens(llama_dir)
    tensors = load_file(llama_dir / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for file, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, llama_dir / file)
    weight_map = {n: file for file, shard_names in shards.items() for n in shard_names}
    (llama_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (llama_dir / "model.safetensors").unlink()
    assert tokens(llama_dir) == expected


def test_tied_checkpoint_may_carry_an_lm_head_copy(tiny_models, tmp_path):
    directory = shutil.copytree(tiny_models.path("qwen3"), tmp_path / "qwen3")
    expected = tokens(directory)
    embedding = "model.embed_tokens.weight"
    rewrite(directory, lambda t: t.update({"lm_head.weight": t[embedding].clone()}))
    assert tokens(directory) == expected


@pytest.mark.skipif(unavailable("cpu") is not None, reason="the native kernels are not built")
def test_a_native_table_packs_the_loaded_weights_and_generates_the_same_tokens(
    tiny_models, monkeypatch
):
    """Every projection and the tied head are packed once loaded (native linear wants
    them so); torch's table keeps them as loaded; both generate the same tokens."""
    def load() -> LLM:
        return LLM(str(tiny_models.path("qwen3")), num_blocks=16, max_model_len=64,
                   decision=EAGER)

    def layouts(llm: LLM) -> set[int]:
        model = llm.step_loop.runner.model
        assert model.config.tie_word_embeddings
        return {m.weight.dim() for m in model.modules() if isinstance(m, Linear)} | {
            model.embed_tokens.dim()}

    native = load()
    assert layouts(native) == {3}
    monkeypatch.setenv("INTERLOCK_KERNELS", "torch")
    reference = load()
    assert layouts(reference) == {2}
    assert (native.generate([PROMPT], GREEDY)[0].token_ids
            == reference.generate([PROMPT], GREEDY)[0].token_ids)


def test_half_precision_dtypes_load_and_auto_follows_the_checkpoint(llama_dir):
    for dtype in ("bfloat16", "float16"):
        llm = LLM(str(llama_dir), dtype=dtype, num_blocks=16, max_model_len=64, decision=EAGER)
        assert llm.step_loop.runner.model.embed_tokens.dtype == getattr(torch, dtype)
        assert len(llm.generate([PROMPT], GREEDY)[0].token_ids) == GREEDY.max_tokens
    config = json.loads((llama_dir / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (llama_dir / "config.json").write_text(json.dumps(config))
    llm = LLM(str(llama_dir), num_blocks=16, max_model_len=64, decision=EAGER)
    assert llm.step_loop.runner.model.embed_tokens.dtype == torch.bfloat16
    assert llm.step_loop.runner.kv_caches[0][0].dtype == torch.bfloat16


def test_dummy_weights_are_seeded_and_need_only_a_config(llama_dir):
    (llama_dir / "model.safetensors").unlink()
    first = tokens(llama_dir, load_format="dummy", seed=1)
    assert tokens(llama_dir, load_format="dummy", seed=1) == first
    llm = LLM(str(llama_dir), load_format="dummy", seed=2, num_blocks=16, max_model_len=64,
              decision=EAGER)
    llm_same = LLM(str(llama_dir), load_format="dummy", seed=1, num_blocks=16, max_model_len=64,
                   decision=EAGER)
    def weights(llm: LLM) -> torch.Tensor:
        return llm.step_loop.runner.model.layers[0].self_attn.qkv_proj.weight

    assert not torch.equal(weights(llm), weights(llm_same))


def test_demo_model_is_reproducible_and_matches_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    demo = LLM("demo", num_blocks=8, decision=EAGER)
    params = sum(p.numel() for p in demo.step_loop.runner.model.parameters())
    assert 45e6 < params < 60e6
    ours = demo.generate([PROMPT], GREEDY)[0].token_ids
    assert LLM("demo", num_blocks=8, decision=EAGER).generate([PROMPT], GREEDY)[0].token_ids == ours

    hf = AutoModelForCausalLM.from_pretrained(write_demo_checkpoint(tmp_path / "demo"))
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=6, min_new_tokens=6,
                          do_sample=False, pad_token_id=0)
    assert tuple(out[0, len(PROMPT):].tolist()) == ours
