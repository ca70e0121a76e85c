"""Discovery: entry points and in-process plugins, quarantine, strict mode, disabling,
conflicts and API versioning."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from plugin_builders import Declares, make_dist, spec, spec_module

from interlock import plugins
from interlock.plugins import PlatformSupport, PluginError, RunnerSpec, hookimpl
from interlock.plugins.discovery import PluginSource, discover
from interlock.plugins.settings import Settings


def _installed(
    tmp_path: Path,
    dist: str,
    modules: dict[str, str],
    entry_points: dict[str, str],
    version: str = "1.2",
) -> None:
    sys.path.insert(0, str(make_dist(tmp_path / dist, dist, version, entry_points, modules)))
    plugins.reset()


def _record(name: str) -> plugins.PluginRecord:
    return next(p for p in plugins.load_registry(refresh=True).plugins if p.name == name)


def test_builtins_register_through_entry_points() -> None:
    registry = plugins.load_registry(refresh=True)
    builtins = {p.name: p for p in registry.plugins if p.distribution == "interlock"}
    assert {name: p.source for name, p in builtins.items()} == {
        "mrv1": "interlock.runners.mrv1.plugin",
        "mrv2": "interlock.runners.mrv2.plugin",
    }
    assert all(p.status == "ok" for p in builtins.values())
    assert {"mrv1", "mrv2"} <= set(registry.runner_names())
    assert registry.runner("mrv2").plugin.provider.startswith("mrv2 (interlock ")


def test_fixture_registers_an_object_for_one_test(register_plugin) -> None:  # type: ignore[no-untyped-def]
    record = register_plugin(Declares(spec("fixture_runner")), "fixture-plugin")
    assert record.status == "ok"
    assert record.distribution == "in-process"
    assert plugins.load_registry().runner("fixture_runner").plugin.name == "fixture-plugin"


def test_fixture_registration_ends_with_the_test() -> None:
    assert plugins.load_registry().find("fixture_runner") is None


def test_entry_point_of_an_installed_distribution(tmp_path: Path) -> None:
    _installed(
        tmp_path, "acme-runners", {"acme_plugin": spec_module("acme")}, {"acme": "acme_plugin"}
    )
    record = _record("acme")
    assert (record.distribution, record.version, record.source) == (
        "acme-runners",
        "1.2",
        "acme_plugin",
    )
    assert record.status == "ok"
    assert [s.name for s in record.runners] == ["acme"]
    assert plugins.load_registry().runner("acme").plugin is record


def test_import_failure_is_quarantined(tmp_path: Path) -> None:
    broken = "import json\nimport definitely_not_installed_dep\n"
    _installed(tmp_path, "broken-dist", {"broken_plugin": broken}, {"broken": "broken_plugin"})
    record = _record("broken")
    assert record.status == "failed"
    assert "ModuleNotFoundError: No module named 'definitely_not_installed_dep'" in record.detail
    assert record.detail.endswith("broken_plugin.py:2)")
    registry = plugins.load_registry()
    assert {"mrv1", "mrv2"} <= set(registry.runner_names())  # everything else keeps working


def test_hook_exception_is_quarantined(register_plugin) -> None:  # type: ignore[no-untyped-def]
    class Raises:
        @hookimpl
        def interlock_runner_specs(self) -> list[RunnerSpec]:
            raise RuntimeError("cannot read my config")

    record = register_plugin(Raises(), "raises")
    assert record.status_line.startswith("failed: RuntimeError: cannot read my config (at ")
    assert __file__ in record.detail
    assert plugins.load_registry().find("mrv1") is not None


@pytest.mark.parametrize(
    ("plugin", "detail"),
    [
        (
            type("Typo", (), {"interlock_runner_spec": hookimpl(lambda self: [])})(),
            "implements unknown hooks interlock_runner_spec",
        ),
        (
            type("Dict", (), {"interlock_runner_specs": hookimpl(lambda self: {"a": 1})})(),
            "interlock_runner_specs returned dict, expected a list of RunnerSpec",
        ),
        (
            type("Raw", (), {"interlock_runner_specs": hookimpl(lambda self: [{"name": "a"}])})(),
            "interlock_runner_specs returned a dict, expected RunnerSpec",
        ),
        (
            type("Bad", (), {"interlock_runner_specs": hookimpl(lambda self: [spec("Bad")])})(),
            "invalid declaration: runner 'Bad': name: 'Bad' does not match",
        ),
    ],
)
def test_contract_violations_are_failures(register_plugin, plugin: object, detail: str) -> None:  # type: ignore[no-untyped-def]
    record = register_plugin(plugin, "violator")
    assert record.status == "failed"
    assert detail in record.detail


def test_strict_mode_makes_failures_fatal(register_plugin, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    class Raises:
        @hookimpl
        def interlock_runner_specs(self) -> list[RunnerSpec]:
            raise RuntimeError("boom")

    monkeypatch.setenv("INTERLOCK_PLUGINS_STRICT", "1")
    with pytest.raises(
        PluginError,
        match=r"STRICT=1: plugin raises \(in-process 0\) failed: "
        r"RuntimeError: boom",
    ) as info:
        register_plugin(Raises(), "raises")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_strict_mode_value_is_checked(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("INTERLOCK_PLUGINS_STRICT", "yes")
    with pytest.raises(PluginError, match="'yes': allowed values are 0 and 1"):
        plugins.load_registry()


def test_disabled_plugins_are_not_imported(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _installed(
        tmp_path,
        "loud-dist",
        {"loud_plugin": "raise SystemError('imported!')\n"},
        {"loud": "loud_plugin"},
    )
    monkeypatch.setenv("INTERLOCK_DISABLE_PLUGINS", "loud, mrv2 ,nosuch")
    registry = plugins.load_registry(refresh=True)
    status = {p.name: p.status for p in registry.plugins}
    assert (status["loud"], status["mrv2"], status["mrv1"]) == ("disabled", "disabled", "ok")
    assert "loud_plugin" not in sys.modules
    assert registry.runner_names() == ["mrv1"]
    assert "INTERLOCK_DISABLE_PLUGINS names 'nosuch', which is not an installed plugin" in (
        registry.problems()
    )
    assert "plugin mrv2 (interlock" in registry.why_missing("mrv2")


def test_duplicate_runner_names_are_an_error_naming_both(tmp_path: Path) -> None:
    _installed(
        tmp_path, "alpha-dist", {"alpha_plugin": spec_module("twin")}, {"alpha": "alpha_plugin"}
    )
    _installed(tmp_path, "beta-dist", {"beta_plugin": spec_module("twin")}, {"beta": "beta_plugin"})
    registry = plugins.load_registry(refresh=True)
    assert "twin" not in registry.runner_names()
    with pytest.raises(PluginError) as info:
        registry.runner("twin")
    message = str(info.value)
    assert "alpha (alpha-dist 1.2)" in message and "beta (beta-dist 1.2)" in message
    assert "neither is preferred" in message
    assert message in registry.problems()


def test_duplicate_runner_names_are_fatal_in_strict_mode(register_plugin, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("INTERLOCK_PLUGINS_STRICT", "1")
    wanted = "registered by the built-in plugin mrv1 .* and by copycat"
    with pytest.raises(PluginError, match=wanted):
        register_plugin(Declares(spec("mrv1")), "copycat")


def test_same_plugin_name_from_two_distributions() -> None:
    sources = [
        PluginSource("same", dist, "1", "m", lambda d=dist: Declares(spec(f"r_{d}")))
        for dist in ("one", "two")
    ]
    found = discover(sources, Settings()).registry
    assert [p.status_line for p in found.plugins] == [
        "failed: plugin name 'same' is used by one 1 and two 1; choose with "
        "INTERLOCK_DISABLE_PLUGINS=one:same or INTERLOCK_DISABLE_PLUGINS=two:same"
    ] * 2
    picked = discover(sources, Settings(disabled=frozenset({"one:same"}))).registry
    assert [p.status for p in picked.plugins] == ["disabled", "ok"]


def test_incompatible_api_is_skipped_before_anything_else_runs() -> None:
    calls = []

    class Future:
        @hookimpl
        def interlock_runner_specs(self) -> list[RunnerSpec]:
            return [spec("future", plugin_api=">=2", factory="future_runner_module:Runner")]

        @hookimpl
        def interlock_kernel_specs(self) -> list:
            calls.append("kernels")
            return []

    source = PluginSource("future", "future-dist", "3.0", "m", Future)
    record = discover([source], Settings()).registry.plugins[0]
    assert record.status_line == (
        "incompatible: runner 'future' needs plugin API >=2; this interlock provides 1.0"
    )
    assert calls == []
    assert "future_runner_module" not in sys.modules
    assert "which is incompatible" in plugins.PluginRegistry([record]).why_missing("future")


def test_kernel_specs_are_collected() -> None:
    from interlock.plugins import KernelSpec

    kernel = KernelSpec(
        op="rms_norm",
        backend="mine",
        target="mine:rms_norm",
        platforms={"cpu"},
        dtypes={"float32"},
        plugin_api=">=1",
    )

    class Kernels:
        @hookimpl
        def interlock_kernel_specs(self) -> list[KernelSpec]:
            return [kernel]

    record = discover(
        [PluginSource("k", "k-dist", "1", "m", Kernels)], Settings()
    ).registry.plugins[0]
    assert (record.status, record.kernels, record.runners) == ("ok", (kernel,), ())


def test_failed_plugin_is_mentioned_only_for_runners_it_may_provide() -> None:
    class Raises:
        @hookimpl
        def interlock_runner_specs(self) -> list[RunnerSpec]:
            raise RuntimeError("boom")

    ok = PluginSource(
        "good",
        "good-dist",
        "1",
        "m",
        lambda: Declares(spec("good", {"cpu": PlatformSupport(cudagraph={"none"})})),
    )
    bad = PluginSource("bad", "bad-dist", "2", "m", Raises)
    registry = discover([ok, bad], Settings()).registry
    assert registry.find("good") is not None
    missing = registry.why_missing("eager")
    assert "plugin bad (bad-dist 2) may provide it but failed to load: RuntimeError: boom" in (
        missing
    )


def test_explain_still_answers_with_a_quarantined_plugin(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from interlock.cli import main

    _installed(
        tmp_path,
        "crashy-dist",
        {"crashy_plugin": "raise RuntimeError('crash')\n"},
        {"crashy": "crashy_plugin"},
    )
    assert main(["explain", "LlamaForCausalLM", "--platform", "cuda"]) == 0
    out, _ = capsys.readouterr()
    assert "runner        mrv2" in out and "crashy" not in out
    assert (
        main(["explain", "LlamaForCausalLM", "--platform", "cuda", "--set", "runner=crashy_runner"])
        == 1
    )
    _, err = capsys.readouterr()
    assert (
        "plugin crashy (crashy-dist 1.2) may provide it but failed to load: RuntimeError: "
        "crash (at " in err
    )


def test_strict_failures_reach_the_cli_as_errors(register_plugin, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from interlock.cli import main

    class Raises:
        @hookimpl
        def interlock_runner_specs(self) -> list[RunnerSpec]:
            raise RuntimeError("boom")

    register_plugin(Raises(), "raises")
    monkeypatch.setenv("INTERLOCK_PLUGINS_STRICT", "1")
    assert main(["explain", "LlamaForCausalLM", "--platform", "cpu"]) == 3  # a plugin error
    assert "policy: error: INTERLOCK_PLUGINS_STRICT=1: plugin raises" in capsys.readouterr().err
