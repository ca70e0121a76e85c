"""vLLM's defaults as of 2026-09-01 (seeds/001, vllm#53155), kept as the history policy
examples/history/2026-09-01-vllm-53155.yaml (interlock's shipped policy until it tracked
vLLM 0.33.0); and the seed contexts under the shipped policy, vLLM 0.33.0.

The shipped policy's full agreement with vLLM 0.33.0 is checked against the snapshot
in test_vllm_conformance.py; these are the seed stories, readable.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from interlock.policy import Context, Policy, load_policy, resolve

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seed_53155() -> Policy:
    return load_policy([REPO / "examples" / "history" / "2026-09-01-vllm-53155.yaml"])

DSA = ["DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM", "GlmMoeDsaForCausalLM"]
# DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES as printed in the 2026-09-01 report: vLLM
# 0.29.0's sixteen (DeepseekV4ForConditionalGeneration joined before 0.30.0).
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
def test_seed_table(seed_53155, arch, platform, gfx, runner, breakable, compile) -> None:
    d = resolve(seed_53155, Context(arch, platform, gfx)).decision
    assert (d.runner, d.breakable, d.compile) == (runner, breakable, compile)
    assert d.cudagraph == "full_and_piecewise"


def test_breakable_set_matches_vllm_on_cuda(seed_53155) -> None:
    assert len(BREAKABLE) == 16
    breakable = {
        a for a in seed_53155.catalog if resolve(seed_53155, Context(a, "cuda")).decision.breakable
    }
    assert breakable == set(BREAKABLE)


def test_never_breakable_by_default_on_rocm(seed_53155) -> None:
    for arch in seed_53155.catalog:
        assert resolve(seed_53155, Context(arch, "rocm", "gfx950")).decision.breakable is False


def test_rocm_mrv1_is_exactly_the_dsa_models(seed_53155) -> None:
    mrv1 = {
        a
        for a in seed_53155.catalog
        if resolve(seed_53155, Context(a, "rocm")).decision.runner == "mrv1"
    }
    assert set(DSA) <= mrv1
    assert all(seed_53155.catalog[a].traits.get("attention") == "dsa" for a in mrv1)


def test_rules_have_reasons_and_refs(seed_53155) -> None:
    for rule in seed_53155.rules:
        assert rule.reason
        assert rule.ref and rule.ref.startswith("https://github.com/vllm-project/vllm/")


def test_catalog_covers_the_seeds(seed_53155) -> None:
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
    assert named | common <= set(seed_53155.catalog)


# vLLM 0.33.0 (the shipped policy) on the same seed contexts: MRV2 everywhere, breakable
# graphs on CUDA for vLLM's list, on ROCm for DeepSeek V4.1 only.
SEEDS_033 = [
    # (architecture, platform, device_arch, runner, cudagraph, breakable, compile)
    ("GlmMoeDsaForCausalLM", "rocm", "gfx950", "mrv2", "full_and_piecewise", False, True),
    ("GlmMoeDsaForCausalLM", "cuda", "sm_90", "mrv2", "full_and_piecewise", True, False),
    ("KimiK3ForConditionalGeneration", "rocm", "gfx950", "mrv2", "full_and_piecewise", False, True),
    ("KimiK3ForConditionalGeneration", "cuda", "sm_100", "mrv2", "full_and_piecewise", True, False),
    ("DeepseekV32ForCausalLM", "rocm", "gfx942", "mrv2", "full_and_piecewise", False, True),
    ("DeepseekV41ForCausalLM", "rocm", "gfx950", "mrv2", "full_and_piecewise", True, False),
    ("Step5ForCausalLM", "cuda", "sm_100", "mrv2", "full_and_piecewise", True, False),
    ("LongcatFlashNgramForCausalLM", "cuda", "sm_90", "mrv2", "full", False, False),
    ("LlamaForCausalLM", "rocm", "gfx942", "mrv2", "full_and_piecewise", False, True),
    ("UnknownNewForCausalLM", "cuda", "sm_90", "mrv2", "full_and_piecewise", False, True),
]


@pytest.mark.parametrize(
    ("arch", "platform", "gfx", "runner", "cudagraph", "breakable", "compile"), SEEDS_033
)
def test_seed_table_vllm_0_33(
    shipped, arch, platform, gfx, runner, cudagraph, breakable, compile
) -> None:
    d = resolve(shipped, Context(arch, platform, gfx)).decision
    expected = (runner, cudagraph, breakable, compile)
    assert (d.runner, d.cudagraph, d.breakable, d.compile) == expected


def test_rocm_breakable_is_deepseek_v41_and_hyv4_on_034_and_v41_alone_on_033(shipped) -> None:
    def on_rocm(engine: dict[str, str]) -> set[str]:
        return {
            a
            for a in shipped.catalog
            if resolve(shipped, Context(a, "rocm", "gfx950", engine=engine)).decision.breakable
        }

    assert on_rocm({}) == {"DeepseekV41ForCausalLM", "HYV4ForCausalLM", "HYV4MTPModel"}
    assert on_rocm({"vllm": "0.34.0"}) == on_rocm({})
    assert on_rocm({"vllm": "0.33.0"}) == {"DeepseekV41ForCausalLM"}


def test_no_runner_exception_on_any_platform(shipped) -> None:
    for platform in ("cuda", "rocm"):
        for arch in shipped.catalog:
            assert resolve(shipped, Context(arch, platform)).decision.runner == "mrv2"
