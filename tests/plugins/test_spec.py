"""Runner and kernel specs: validation messages, normalisation, and the built-in declarations."""

from __future__ import annotations

import pytest
from plugin_builders import EAGER_ONLY, spec

from interlock.core.decision import CUDAGRAPH_MODES
from interlock.plugins import KernelSpec, PlatformSupport, SpecError, Unsupported
from interlock.runners.mrv1.plugin import SPEC as MRV1
from interlock.runners.mrv2.plugin import SPEC as MRV2


def test_builtins_declare_vllm_capabilities() -> None:
    for builtin in (MRV1, MRV2):
        assert set(builtin.platforms) == {"cuda", "rocm", "xpu", "cpu"}
        for platform, support in builtin.platforms.items():
            assert support.cudagraph == CUDAGRAPH_MODES
            assert support.breakable
            # torch.compile of graph segments is served where graphs are CUDA graphs.
            assert support.compile == (platform in ("cuda", "rocm"))
        assert {u.feature for u in builtin.unsupported} == {
            "pipeline parallelism",
            "speculative decoding",
        }
    assert all(MRV1.platforms[p].requires == () for p in MRV1.platforms)
    assert {p for p, s in MRV2.platforms.items() if s.requires} == {"cuda", "rocm", "xpu"}
    assert MRV2.platforms["cuda"].requires == ("has_triton",)
    assert (MRV1.fallback, MRV2.fallback) == (None, "mrv1")
    assert MRV1.factory == "interlock.runners.mrv1.runner:MRV1Runner"
    assert MRV2.factory == "interlock.runners.mrv2.runner:MRV2Runner"


def test_sets_are_stored_distinct_in_canonical_order() -> None:
    support = PlatformSupport(cudagraph=["full", "none", "full", "piecewise"])
    assert support.cudagraph == ("none", "piecewise", "full")
    kernel = KernelSpec(
        op="rms_norm",
        backend="mine",
        target="m:f",
        platforms={"cuda", "cpu"},
        dtypes=["float16", "float32"],
        plugin_api=">=1",
    )
    assert kernel.platforms == ("cpu", "cuda")
    assert kernel.dtypes == ("float32", "float16")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: PlatformSupport(cudagraph={"full"}), "must include 'none'"),
        (
            lambda: PlatformSupport(cudagraph={"none", "fulll"}),
            "unknown 'fulll'; allowed: none, piecewise, full, full_decode_only, full_and_piecewise",
        ),
        (lambda: PlatformSupport(cudagraph={"none"}, breakable=True), "needs a graph mode"),
        (lambda: PlatformSupport(cudagraph={"none"}, breakable="yes"), "must be True or False"),
        (
            lambda: PlatformSupport(cudagraph={"none"}, requires={"has_cuda"}),
            "unknown 'has_cuda'; allowed: has_triton",
        ),
        (lambda: PlatformSupport(cudagraph="none"), "must be a set or list"),
        (
            lambda: Unsupported("pp", {"features": {"pipeline_parallel_size": {"gtt": 1}}}),
            "unknown field 'gtt'; allowed: gt, ge, lt, le, eq, ne, in",
        ),
        (lambda: Unsupported("pp", {}), "must be a non-empty mapping"),
        (lambda: spec("Bad"), "runner 'Bad': name: 'Bad' does not match"),
        (lambda: spec("a", plugin_api="1.x"), "plugin_api '1.x' is not a version range"),
        (lambda: spec("a", factory="no colon"), "not an import path"),
        (lambda: spec("a", fallback="a"), "cannot fall back to itself"),
        (lambda: spec("a", platforms={}), "declare at least one"),
        (lambda: spec("a", platforms={"cpu": "all"}), "is not a PlatformSupport"),
        (lambda: spec("a", unsupported=({"features": {}},)), "is not an Unsupported"),
        (lambda: spec("a", description=""), "description: '' must be a non-empty string"),
        (
            lambda: KernelSpec(
                op="rms_norm",
                backend="x",
                target="m:f",
                platforms={"cpu"},
                dtypes={"float64"},
                plugin_api=">=1",
            ),
            "unknown 'float64'; allowed: float32, bfloat16, float16",
        ),
        (
            lambda: KernelSpec(
                op="rms_norm",
                backend="x",
                target="m:f",
                platforms=(),
                dtypes={"float32"},
                plugin_api=">=1",
            ),
            "declare at least one",
        ),
    ],
)
def test_invalid_declarations_name_the_value(build, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SpecError) as info:
        build()
    assert message in str(info.value)


def test_unsupported_conditions_use_the_rule_language() -> None:
    item = Unsupported("big tensor parallelism", {"features": {"tensor_parallel_size": [4, 8]}})
    assert item.when == {"features": {"tensor_parallel_size": [4, 8]}}
    assert spec("a", platforms={"cpu": EAGER_ONLY}, unsupported=(item,)).unsupported == (item,)


def test_to_dict_is_json_ready() -> None:
    data = MRV2.to_dict()
    assert data["platforms"]["cuda"] == {
        "cudagraph": list(CUDAGRAPH_MODES),
        "breakable": True,
        "compile": True,
        "requires": ["has_triton"],
        "max_tensor_parallel_size": None,
    }
    assert data["platforms"]["xpu"]["max_tensor_parallel_size"] == 1
    assert data["unsupported"][0]["when"] == {"features": {"pipeline_parallel_size": {"gt": 1}}}
