"""The shipped policy reproduces vLLM's defaults as of 2026-09-01 (seeds/001, vllm#53155)."""

from __future__ import annotations

import pytest

from interlock.policy import Context, resolve

DSA = ["DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM", "GlmMoeDsaForCausalLM"]
# DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES as printed in the 2026-09-01 report, plus
# DeepseekV4ForConditionalGeneration as current vLLM has it.
BREAKABLE = [
    "DeepseekV32MTPModel",
    "DeepseekV32ForCausalLM",
    "DeepseekV4ForCausalLM",
    "DeepSeekV4MTPModel",
    "Dots3NoteForCausalLM",
    "Dots3NoteMTPModel",
    "GlmMoeDsaForCausalLM",
    "HYV4ForCausalLM",
    "HYV4MTPModel",
    "InklingForCausalLM",
    "InklingForConditionalGeneration",
    "KimiK3ForConditionalGeneration",
    "KimiK3MTPModel",
    "KimiLinearForCausalLM",
    "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration",
    "DeepseekV4ForConditionalGeneration",
]

SEEDS = [
    # (architecture, platform, device_arch, runner, breakable, compile)
    ("GlmMoeDsaForCausalLM", "rocm", "gfx950", "mrv1", False, True),
    ("GlmMoeDsaForCausalLM", "cuda", "sm_90", "mrv2", True, False),
    ("KimiK3ForConditionalGeneration", "rocm", "gfx950", "mrv2", False, True),
    ("KimiK3ForConditionalGeneration", "cuda", "sm_100", "mrv2", True, False),
    ("DeepseekV32ForCausalLM", "cuda", "sm_90", "mrv2", True, False),
    ("DeepseekV32ForCausalLM", "rocm", "gfx942", "mrv1", False, True),
    ("DeepseekV4ForCausalLM", "rocm", "gfx950", "mrv1", False, True),
    ("LlamaForCausalLM", "cuda", "sm_90", "mrv2", False, True),
    ("LlamaForCausalLM", "rocm", "gfx942", "mrv2", False, True),
    ("Qwen2MoeForCausalLM", "rocm", "gfx950", "mrv2", False, True),
    ("KimiLinearForCausalLM", "cuda", "sm_90", "mrv2", True, False),
    ("UnknownNewForCausalLM", "cuda", "sm_90", "mrv2", False, True),
]


@pytest.mark.parametrize(("arch", "platform", "gfx", "runner", "breakable", "compile"), SEEDS)
def test_seed_table(shipped, arch, platform, gfx, runner, breakable, compile) -> None:
    d = resolve(shipped, Context(arch, platform, gfx)).decision
    assert (d.runner, d.breakable, d.compile) == (runner, breakable, compile)
    assert d.cudagraph == "full_and_piecewise"


def test_breakable_set_matches_vllm_on_cuda(shipped) -> None:
    assert len(BREAKABLE) == 17
    breakable = {
        a for a in shipped.catalog if resolve(shipped, Context(a, "cuda")).decision.breakable
    }
    assert breakable == set(BREAKABLE)


def test_never_breakable_by_default_on_rocm(shipped) -> None:
    for arch in shipped.catalog:
        assert resolve(shipped, Context(arch, "rocm", "gfx950")).decision.breakable is False


def test_rocm_mrv1_is_exactly_the_dsa_models(shipped) -> None:
    mrv1 = {
        a for a in shipped.catalog if resolve(shipped, Context(a, "rocm")).decision.runner == "mrv1"
    }
    assert set(DSA) <= mrv1
    assert all(shipped.catalog[a].traits.get("attention") == "dsa" for a in mrv1)


def test_rules_have_reasons_and_refs(shipped) -> None:
    for rule in shipped.rules:
        assert rule.reason
        assert rule.ref and rule.ref.startswith("https://github.com/vllm-project/vllm/pull/")


def test_catalog_covers_the_seeds(shipped) -> None:
    named = {
        "DeepseekV2ForCausalLM",
        "GraniteMoeForCausalLM",
        "LongcatFlashNgramForCausalLM",
        "Qwen2MoeForCausalLM",
        *BREAKABLE,
        *DSA,
    }
    common = {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "MixtralForCausalLM",
        "DeepseekV3ForCausalLM",
    }
    assert named | common <= set(shipped.catalog)
