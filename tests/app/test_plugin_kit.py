"""The plugin test kit: run on the built-in plugins, and its findings on broken ones."""

from __future__ import annotations

import importlib.util

import pytest
from plugin_builders import EAGER_ONLY, EVERY_MODE, Declares, registry_of, spec

import interlock.runners.mrv1.plugin
import interlock.runners.mrv2.plugin
from interlock.plugins import KernelSpec, Unsupported, load_registry
from interlock.testing import RunnerPluginContract
from interlock.testing.checks import (
    check_capabilities,
    check_factories,
    check_kernels,
    check_loads,
    load_under_test,
)

pytestmark = pytest.mark.usefixtures("fresh_plugins")


class TestMrv1(RunnerPluginContract):
    plugin = interlock.runners.mrv1.plugin


class TestMrv2(RunnerPluginContract):
    plugin = interlock.runners.mrv2.plugin

    def test_factories_importable(self, record) -> None:  # type: ignore[no-untyped-def]
        if importlib.util.find_spec("interlock.runners.mrv2.runner") is None:
            # The MRV2 runner object is not written yet: the kit must say so, clearly.
            [finding] = check_factories(record)
            wanted = (
                "interlock.runners.mrv2.runner:MRV2Runner is not importable: ModuleNotFoundError"
            )
            assert wanted in str(finding)
        else:
            super().test_factories_importable(record)


def messages(findings: list) -> list[str]:
    return [str(f) for f in findings]


def test_unimportable_factory_is_reported_with_the_reason() -> None:
    record = load_under_test(
        Declares(spec("ghost", factory="no_such_runner_pkg.runner:Runner")), "ghost"
    )
    assert messages(check_factories(record)) == [
        "factory: ghost: no_such_runner_pkg.runner:Runner is not importable: "
        "ModuleNotFoundError: No module named 'no_such_runner_pkg'"
    ]


def test_factory_that_is_not_callable() -> None:
    record = load_under_test(
        Declares(spec("odd", factory="interlock.core.decision:CUDAGRAPH_MODES")), "odd"
    )
    assert messages(check_factories(record)) == [
        "factory: odd: interlock.core.decision:CUDAGRAPH_MODES is a tuple, not callable"
    ]


def test_loading_problems() -> None:
    installed = load_registry()
    clash = load_under_test(Declares(spec("mrv1")), "clash")
    assert messages(check_loads(clash, installed)) == [
        f"loads: mrv1: also registered by {installed.runner('mrv1').plugin.provider}"
    ]
    empty = load_under_test(Declares(), "empty")
    assert messages(check_loads(empty, installed)) == [
        "loads: empty: declares no runner and no kernel"
    ]
    twice = load_under_test(Declares(spec("twin"), spec("twin")), "twice")
    assert messages(check_loads(twice, installed)) == ["loads: twin: declared twice by this plugin"]
    future = load_under_test(Declares(spec("future", plugin_api=">=2")), "future")
    assert messages(check_loads(future, installed)) == [
        "loads: future: incompatible: runner 'future' needs plugin API >=2; this interlock "
        "provides 1.0"
    ]


def test_capability_consistency() -> None:
    installed = registry_of(spec("base"))
    loop = load_under_test(Declares(spec("a", fallback="b"), spec("b", fallback="a")), "loop")
    assert "capabilities: a: fallback chain loops: a -> b -> a" in messages(
        check_capabilities(loop, installed)
    )
    dangling = load_under_test(Declares(spec("c", fallback="gone")), "dangling")
    assert messages(check_capabilities(dangling, installed)) == [
        "capabilities: c: falls back to 'gone', which is not registered"
    ]
    chained = load_under_test(Declares(spec("d", fallback="base")), "chained")
    assert check_capabilities(chained, installed) == []
    whole = spec(
        "e",
        {"cpu": EAGER_ONLY, "cuda": EVERY_MODE},
        unsupported=(Unsupported("anything on cuda", {"platform": "cuda"}),),
    )
    record = load_under_test(Declares(whole), "whole")
    assert messages(check_capabilities(record, installed)) == [
        "capabilities: e: unsupported[0] (anything on cuda) excludes whole platforms 'cuda': "
        "leave them out of `platforms` instead"
    ]


def test_kernel_declarations() -> None:
    pytest.importorskip("torch")
    bad = KernelSpec(
        op="rms_nrom",
        backend="mine",
        target="interlock.core.decision:CUDAGRAPH_MODES",
        platforms={"cpu"},
        dtypes={"float32"},
        plugin_api=">=1",
    )
    record = load_under_test(Declares(kernels=(bad,)), "kernels")
    found = messages(check_kernels(record))
    assert found[0].startswith("kernels: rms_nrom/mine: unknown op 'rms_nrom'; ops: ")
    assert found[1] == (
        "kernels: rms_nrom/mine: interlock.core.decision:CUDAGRAPH_MODES is not callable"
    )


def test_the_suites_old_name_is_refused_with_its_new_one() -> None:
    import interlock.testing

    with pytest.raises(AttributeError, match="now RunnerPluginContract"):
        interlock.testing.RunnerPluginConformance  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'Nonesuch'"):
        interlock.testing.Nonesuch  # noqa: B018
