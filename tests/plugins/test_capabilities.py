"""Stage 5: fallback chains, downgrades and forced-value errors, with their trace entries."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from plugin_builders import EAGER_ONLY, EVERY_MODE, PIPELINE, record, registry_of, spec

import interlock.policy.context
from interlock.plugins import PlatformSupport, PluginRegistry
from interlock.plugins.capabilities import CapabilityError, capability_stage
from interlock.policy import load_policy_text, make_context, resolve
from interlock.policy.trace import CAPABILITIES

GPU_NEEDS_TRITON = PlatformSupport(
    cudagraph=EVERY_MODE.cudagraph, breakable=True, compile=True, requires={"has_triton"}
)
PIECEWISE = PlatformSupport(cudagraph={"none", "piecewise"})

FAST = spec(
    "fast", {"cpu": EVERY_MODE, "cuda": GPU_NEEDS_TRITON}, unsupported=(PIPELINE,), fallback="safe"
)
SAFE = spec("safe", {"cpu": PIECEWISE, "cuda": PIECEWISE})
EAGER = spec("eager", {"cpu": EAGER_ONLY}, fallback="fast")
REGISTRY = registry_of(FAST, SAFE, EAGER)

POLICY = """\
schema_version: 1
version: "t"
catalog:
  Dense: {{moe: false, attention: gqa}}
defaults: {{runner: {runner}, cudagraph: {cudagraph}, breakable: true, compile: {compile}}}
env:
  USE_FAST: {{field: runner, values: {{"0": safe, "1": fast}}}}
rules:
  - id: eager-on-request
    when: {{features: {{eager: true}}}}
    set: {{runner: eager}}
    reason: the request asks for the eager runner
"""


def decide(
    registry: PluginRegistry = REGISTRY,
    runner: str = "fast",
    cudagraph: str = "full_and_piecewise",
    compile: str = "false",
    overrides: dict[str, Any] | None = None,
    platform: str = "cpu",
    **context: Any,
) -> Any:
    pol = load_policy_text(POLICY.format(runner=runner, cudagraph=cudagraph, compile=compile))
    ctx = make_context("Dense", platform=platform, **context)
    return resolve(pol, ctx, overrides, capabilities=capability_stage(registry))


def stage5(res: Any) -> list[tuple[str, dict, str]]:
    return [(s.name, s.sets, s.note) for s in res.trace if s.stage == CAPABILITIES]


def test_a_supported_decision_is_kept_and_names_its_provider() -> None:
    res = decide()
    assert (res.decision.runner, res.decision.cudagraph, res.decision.breakable) == (
        "fast",
        "full_and_piecewise",
        True,
    )
    assert stage5(res) == [
        (
            "runner fast",
            {},
            "provided by plugin p-fast (fast-dist 1.0); on cpu "
            "it serves cudagraph none, piecewise, full, full_decode_only, "
            "full_and_piecewise; breakable capture; torch.compile",
        )
    ]


def test_unsupported_runner_falls_back_and_every_field_follows() -> None:
    res = decide(platform="cuda", features={"has_triton": False})
    assert (res.decision.runner, res.decision.cudagraph, res.decision.breakable) == (
        "safe",
        "piecewise",
        False,
    )
    assert stage5(res)[:3] == [
        (
            "runner fast -> safe",
            {"runner": "safe"},
            "fast requires Triton on cuda (has_triton=false, given); "
            "fallback declared by fast in plugin p-fast (fast-dist 1.0)",
        ),
        (
            "cudagraph full_and_piecewise -> piecewise",
            {"cudagraph": "piecewise"},
            "safe does not support cudagraph=full_and_piecewise on cuda",
        ),
        (
            "breakable true -> false",
            {"breakable": False},
            "safe does not support breakable capture on cuda",
        ),
    ]
    runner = res.provenance["runner"]
    assert (runner.stage, runner.source) == (CAPABILITIES, "fast")
    assert "fast (from defaults at <policy>:5) cannot serve this context" in runner.reason
    assert all(res.provenance[f].stage == CAPABILITIES for f in ("cudagraph", "breakable"))


def test_unsupported_feature_names_the_feature() -> None:
    res = decide(features={"pipeline_parallel_size": 4})
    assert res.decision.runner == "safe"
    assert (
        "fast does not support pipeline parallelism (pipeline_parallel_size=4)"
        in (stage5(res)[0][2])
    )


@pytest.mark.parametrize(
    ("mode", "steps"),
    [
        ("full_and_piecewise", ["full_and_piecewise -> piecewise", "piecewise -> none"]),
        ("piecewise", ["piecewise -> none"]),
        ("full", ["full -> none"]),
        ("full_decode_only", ["full_decode_only -> none"]),
        ("none", []),
    ],
)
def test_cudagraph_downgrade_chains(mode: str, steps: list[str]) -> None:
    res = decide(runner="eager", cudagraph=mode)
    assert res.decision.cudagraph == "none"
    names = [name for name, _, _ in stage5(res)]
    assert [n.removeprefix("cudagraph ") for n in names if n.startswith("cudagraph")] == steps
    if steps:
        assert res.provenance["cudagraph"].reason.endswith(
            f"downgraded {' -> '.join([mode, *(s.split(' -> ')[1] for s in steps)])}"
        )


def test_forced_runner_is_an_error_naming_every_item_and_the_way_out() -> None:
    with pytest.raises(CapabilityError) as info:
        decide(
            platform="cuda",
            env={"USE_FAST": "1"},
            features={"has_triton": False, "pipeline_parallel_size": 2},
        )
    assert info.value.forced == ("runner",)
    assert str(info.value) == (
        "runner=fast is forced by USE_FAST=1 (given) but cannot be served:\n"
        "  - fast requires Triton on cuda (has_triton=false, given)\n"
        "  - fast does not support pipeline parallelism (pipeline_parallel_size=2)\n"
        "to choose otherwise:\n"
        "  - unset USE_FAST to let the policy decide, or set USE_FAST=0 (safe); "
        "runners that serve this context: safe"
    )


def test_forced_graph_mode_moves_an_automatic_runner() -> None:
    res = decide(runner="eager", overrides={"cudagraph": "full"})
    assert (res.decision.runner, res.decision.cudagraph) == ("fast", "full")
    assert stage5(res)[0][:2] == ("runner eager -> fast", {"runner": "fast"})
    assert "eager does not support cudagraph=full on cpu" in stage5(res)[0][2]


def test_forced_graph_mode_no_runner_on_the_chain_serves() -> None:
    with pytest.raises(CapabilityError) as info:
        decide(platform="cuda", features={"has_triton": False}, overrides={"cudagraph": "full"})
    assert info.value.forced == ("cudagraph",)
    message = str(info.value)
    assert message.startswith("forced cudagraph=full cannot be served: runner=fast")
    assert "safe does not support cudagraph=full on cuda (it supports: none, piecewise)" in message
    assert "drop the cudagraph override" in message


def test_forced_runner_and_graph_mode_both_named() -> None:
    with pytest.raises(CapabilityError) as info:
        decide(overrides={"runner": "safe", "cudagraph": "full", "breakable": True})
    assert info.value.forced == ("runner", "breakable", "cudagraph")
    message = str(info.value)
    assert "runner=safe is forced by an explicit override (runner=safe)" in message
    assert "safe does not support cudagraph=full on cpu" in message
    assert "safe does not support breakable capture on cpu" in message
    assert "drop the runner override, or override with one of: runner=fast" in message
    assert (
        "drop the cudagraph override (cudagraph=full); on cpu safe serves cudagraph none, "
        "piecewise" in message
    )


def test_context_no_runner_serves_is_an_error_not_a_switch() -> None:
    with pytest.raises(CapabilityError) as info:
        decide(platform="tpu")
    assert info.value.forced == ()
    message = str(info.value)
    assert message.startswith(
        "no runner can serve this context: runner=fast (defaults at "
        "<policy>:5) and its fallbacks (fast -> safe):"
    )
    assert "safe does not serve platform tpu (it serves: cpu, cuda)" in message


def test_unregistered_runner_did_you_mean() -> None:
    with pytest.raises(
        CapabilityError,
        match=r"runner 'fasst' is not registered \(did you mean "
        r"'fast'\?\)",
    ) as info:
        decide(runner="fasst")
    assert info.value.forced == ()
    with pytest.raises(CapabilityError) as forced:
        decide(overrides={"runner": "nope"})
    assert forced.value.forced == ("runner",)


def test_fallback_to_a_missing_runner() -> None:
    with pytest.raises(
        CapabilityError,
        match="fast cannot serve this context and falls back to "
        "safe: runner 'safe' is not registered",
    ):
        decide(registry=registry_of(FAST), features={"pipeline_parallel_size": 2})


def test_fallback_loop_ends_in_an_error() -> None:
    a = spec("a", {"cuda": EVERY_MODE}, fallback="b")
    b = spec("b", {"cuda": EVERY_MODE}, fallback="a")
    with pytest.raises(CapabilityError, match=r"\(a -> b\)"):
        decide(registry=registry_of(a, b), runner="a")


def test_quarantined_plugin_is_mentioned_only_when_the_policy_may_need_it() -> None:
    failed = record(
        name="eagerplug",
        distribution="eager-dist",
        status="failed",
        detail="ImportError: no torch here",
    )
    registry = PluginRegistry([*REGISTRY.plugins, failed])
    res = decide(registry=registry)
    assert "eagerplug" not in repr(res.to_dict())
    with pytest.raises(
        CapabilityError,
        match="plugin eagerplug \\(eager-dist 1.0\\) may provide "
        "it but failed to load: ImportError: no torch",
    ):
        decide(registry=registry, runner="turbo")


def test_has_triton_origins(monkeypatch: pytest.MonkeyPatch) -> None:
    named = make_context("Dense", platform="rocm")
    assert named.features["has_triton"] is True
    assert named.source("features.has_triton").startswith("assumed")
    given = make_context("Dense", platform="rocm", features={"has_triton": False})
    assert given.source("features.has_triton") == "given"

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        interlock.policy.context, "detect_platform", lambda: ("cuda", "sm_90", "test")
    )
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "triton" else real_find_spec(name, *a),
    )
    detected = make_context("Dense")
    assert detected.features["has_triton"] is False
    assert detected.source("features.has_triton") == "detected (triton is not installed)"


def test_shipped_policy_without_triton_falls_back_to_mrv1(cli, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NO_COLOR", "1")
    code, out, _ = cli(
        "explain", "LlamaForCausalLM", "--platform", "cuda", "--feature", "has_triton=false"
    )
    assert code == 0
    assert "runner mrv2 -> mrv1" in out
    assert "mrv2 requires Triton on cuda (has_triton=false, given)" in out
    assert "provided by plugin mrv1 (interlock " in out


def test_shipped_policy_forced_mrv2_without_triton_is_an_error(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(
        "explain",
        "LlamaForCausalLM",
        "--platform",
        "rocm",
        "--feature",
        "has_triton=false",
        "--env",
        "VLLM_USE_V2_MODEL_RUNNER=1",
    )
    assert (code, out) == (1, "")
    assert "runner=mrv2 is forced by VLLM_USE_V2_MODEL_RUNNER=1" in err
    assert "mrv2 requires Triton on rocm" in err
    assert "VLLM_USE_V2_MODEL_RUNNER=0 (mrv1)" in err


@pytest.mark.parametrize(
    ("feature", "named"),
    [
        ("pipeline_parallel_size=2", "pipeline parallelism (pipeline_parallel_size=2)"),
        ("speculative=eagle", "speculative decoding (speculative=eagle)"),
    ],
)
def test_shipped_runners_refuse_what_they_cannot_serve(cli, feature: str, named: str) -> None:  # type: ignore[no-untyped-def]
    code, _, err = cli(
        "explain", "LlamaForCausalLM", "--platform", "cuda", "--feature", feature
    )
    assert code == 1
    assert f"mrv2 does not support {named}" in err
    assert f"mrv1 does not support {named}" in err


def test_switches_fall_back_to_false() -> None:
    res = decide(runner="safe", cudagraph="piecewise", compile="true")
    assert (res.decision.breakable, res.decision.compile) == (False, False)
    assert [step[:2] for step in stage5(res)[:2]] == [
        ("breakable true -> false", {"breakable": False}),
        ("compile true -> false", {"compile": False}),
    ]
    assert res.provenance["compile"].reason == "safe does not support torch.compile on cpu"


def test_forced_compile_is_checked_like_any_forced_value() -> None:
    with pytest.raises(CapabilityError) as info:
        decide(runner="safe", overrides={"runner": "safe", "compile": True, "breakable": False})
    assert info.value.forced == ("runner", "compile")
    assert "safe does not support torch.compile on cpu" in str(info.value)
    assert "on cpu safe has no torch.compile" in str(info.value)
