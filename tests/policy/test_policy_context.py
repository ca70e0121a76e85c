"""Context facts: traits derived from an HF config.json, --model, platform detection."""

from __future__ import annotations

import json
import sys

import pytest

from interlock.core.platform import detect_platform
from interlock.policy import PolicyError, make_context
from interlock.policy.context import read_model_config, traits_from_config


def values(config: dict) -> dict:
    return {k: v for k, (v, _) in traits_from_config(config).items()}


DEEPSEEK_V32 = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "n_routed_experts": 256,
    "kv_lora_rank": 512,
    "index_topk": 2048,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "quantization_config": {"quant_method": "fp8"},
}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (DEEPSEEK_V32, {"moe": True, "attention": "dsa", "mtp": True, "quantized": True}),
        (
            {"n_routed_experts": 64, "kv_lora_rank": 512, "num_attention_heads": 16},
            {"moe": True, "attention": "mla", "mtp": False, "quantized": False},
        ),
        (
            {"num_attention_heads": 32, "num_key_value_heads": 8},
            {"moe": False, "attention": "gqa", "mtp": False, "quantized": False},
        ),
        (
            {"num_attention_heads": 32, "num_key_value_heads": 32, "num_local_experts": 8},
            {"moe": True, "attention": "mha", "mtp": False, "quantized": False},
        ),
        ({"num_attention_heads": 16, "num_experts": 0}, {"moe": False, "attention": "mha"}),
        (
            {"layer_types": ["linear_attention"] * 3 + ["full_attention"], "num_experts": 512},
            {"moe": True, "attention": "hybrid"},
        ),
        ({"layer_types": ["linear_attention"] * 2}, {"attention": "linear"}),
        (
            {
                "layer_types": ["sliding_attention", "full_attention"],
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
            },
            {"attention": "gqa"},
        ),
        (
            {"linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4]}},
            {"attention": "hybrid"},
        ),
        (
            {"text_config": {"num_attention_heads": 8, "num_key_value_heads": 2}},
            {"attention": "gqa"},
        ),
    ],
)
def test_traits_from_config(config: dict, expected: dict) -> None:
    derived = values(config)
    assert {k: derived.get(k) for k in expected} == expected


def test_unknown_attention_is_left_out() -> None:
    assert "attention" not in values({"vocab_size": 10})


def test_trait_notes_say_which_key_decided() -> None:
    notes = {k: why for k, (_, why) in traits_from_config(DEEPSEEK_V32).items()}
    assert notes["attention"] == "index_topk=2048"
    assert notes["moe"] == "n_routed_experts=256"
    assert notes["quantized"] == "quantization_config.quant_method=fp8"


def test_model_directory(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V32))
    ctx = make_context(model=tmp_path, platform="rocm", device_arch="gfx950")
    assert ctx.architecture == "DeepseekV32ForCausalLM"
    assert ctx.model_traits["attention"] == "dsa"
    assert ctx.source("architecture").startswith("model config")
    assert ctx.source("traits.attention") == "model config (index_topk=2048)"
    assert ctx.source("platform") == "given"
    assert make_context(model=tmp_path / "config.json", platform="cpu").architecture == (
        "DeepseekV32ForCausalLM"
    )


def test_model_architecture_mismatch_is_an_error(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V32))
    with pytest.raises(PolicyError, match="disagrees with the model's architectures"):
        make_context("LlamaForCausalLM", model=tmp_path, platform="cuda")


def test_bad_model_configs(tmp_path) -> None:
    with pytest.raises(PolicyError, match="cannot read model config"):
        read_model_config(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "architectures": [\n')
    with pytest.raises(PolicyError) as info:
        read_model_config(bad)
    assert info.value.file == str(bad) and info.value.line == 3
    bad.write_text('{"model_type": "llama"}')
    with pytest.raises(PolicyError, match=r"no architectures\[0\]"):
        make_context(model=bad, platform="cpu")


def test_explicit_device_arch_without_platform_keeps_it(monkeypatch) -> None:
    fake = ("cuda", "sm_90", "fake")
    monkeypatch.setattr("interlock.policy.context.detect_platform", lambda: fake)
    ctx = make_context("X", device_arch="sm_100")
    assert (ctx.platform, ctx.device_arch) == ("cuda", "sm_100")
    assert ctx.source("platform") == "detected (fake)"
    assert ctx.source("device_arch") == "given"
    ctx = make_context("X")
    assert ctx.device_arch == "sm_90" and ctx.source("device_arch") == "detected (fake)"


def test_named_platform_never_probes(monkeypatch) -> None:
    def boom() -> tuple[str, str, str]:
        raise AssertionError("detect_platform called")

    monkeypatch.setattr("interlock.policy.context.detect_platform", boom)
    ctx = make_context("X", platform="rocm")
    assert ctx.device_arch == "" and ctx.source("device_arch").startswith("assumed")


def test_without_torch_the_platform_is_cpu(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    assert detect_platform() == ("cpu", "", "torch is not installed")


def test_detection_with_torch_on_this_machine() -> None:
    pytest.importorskip("torch")
    platform, device_arch, how = detect_platform()
    import torch

    if not torch.cuda.is_available():
        assert (platform, device_arch) == ("cpu", "")
    else:
        assert platform in ("cuda", "rocm") and device_arch
    assert "torch" in how
    assert "torch" in sys.modules
