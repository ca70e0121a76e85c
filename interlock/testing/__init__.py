"""Pytest support for plugin authors: a fixture and a contract suite (the plugin test kit;
"conformance" is kept for agreement with vLLM's recorded decisions).

In a plugin's own tests::

    # conftest.py
    pytest_plugins = ["interlock.testing"]

    # test_contract.py
    from interlock.testing import RunnerPluginContract
    import my_plugin

    class TestMyPlugin(RunnerPluginContract):
        plugin = my_plugin

and, to try a plugin object inside one test without installing it::

    def test_something(register_plugin):
        record = register_plugin(MyPlugin(), "mine")
        assert record.status == "ok"
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest

from interlock.plugins.manager import add_plugin, load_registry, remove_plugin
from interlock.plugins.registry import PluginRecord
from interlock.testing.checks import (
    MODEL_CHECKS,
    Finding,
    check_capabilities,
    check_factories,
    check_inherited_claims,
    check_kernels,
    check_loads,
    load_under_test,
)

RegisterPlugin = Callable[..., PluginRecord]


@pytest.fixture
def register_plugin() -> Iterator[RegisterPlugin]:
    """``register_plugin(obj, name, distribution=..., version=...)`` -> its PluginRecord.

    The plugin is part of ``interlock.plugins.load_registry()`` until the test ends.
    """
    names: list[str] = []

    def register(
        plugin: object, name: str, *, distribution: str = "in-process", version: str = "0"
    ) -> PluginRecord:
        add_plugin(plugin, name, distribution=distribution, version=version)
        names.append(name)
        return next(p for p in load_registry().plugins if p.name == name)

    yield register
    for name in names:
        remove_plugin(name)


def __getattr__(name: str) -> object:
    # The suite's old name, refused with its new one rather than kept as a silent alias.
    if name == "RunnerPluginConformance":
        raise AttributeError(
            "interlock.testing.RunnerPluginConformance is now RunnerPluginContract (the "
            "suite checks a plugin against the runner contract; \"conformance\" names "
            "agreement with vLLM's recorded decisions): rename it in your test"
        )
    raise AttributeError(f"module 'interlock.testing' has no attribute {name!r}")


def _assert_none(findings: list[Finding]) -> None:
    assert not findings, "\n".join(str(f) for f in findings)


class RunnerPluginContract:
    """Subclass with ``plugin = <your plugin module or object>`` to run the suite on it."""

    plugin: ClassVar[object]
    #: Kernel checks import ``kernels`` (hence torch); turn off for a torch-less CI job.
    check_kernel_specs: ClassVar[bool] = True

    @pytest.fixture
    def record(self) -> PluginRecord:
        name = getattr(self.plugin, "__name__", type(self.plugin).__name__)
        return load_under_test(self.plugin, name.rsplit(".", 1)[-1])

    def test_loads_and_declares(self, record: PluginRecord) -> None:
        _assert_none(check_loads(record, load_registry()))

    def test_capabilities_consistent(self, record: PluginRecord) -> None:
        _assert_none(check_capabilities(record, load_registry()))

    def test_factories_importable(self, record: PluginRecord) -> None:
        _assert_none(check_factories(record))

    def test_claims_no_more_than_its_base(self, record: PluginRecord) -> None:
        _assert_none(check_inherited_claims(record))

    def test_kernel_specs(self, record: PluginRecord) -> None:
        if not record.kernels:
            pytest.skip("the plugin declares no kernels")
        if not self.check_kernel_specs:
            pytest.skip("kernel checks turned off (check_kernel_specs = False)")
        _assert_none(check_kernels(record))

    @pytest.mark.parametrize(
        "check",
        MODEL_CHECKS
        or [pytest.param(None, marks=pytest.mark.skip(reason="no model checks in this kit yet"))],
        ids=lambda c: getattr(c, "__name__", "none"),
    )
    def test_runs_models(
        self, record: PluginRecord, check: Callable[[PluginRecord], list[Finding]]
    ) -> None:
        _assert_none(check(record))
