"""Plugin kernels: declared as data, installed into a kernel registry only when kernels load."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from interlock.plugins import KernelSpec, PluginError, hookimpl, load_registry
from interlock.plugins.kernels import install_plugin_kernels

kernels_registry = pytest.importorskip("interlock.kernels.registry")


def reference_silu(x):  # type: ignore[no-untyped-def]
    return x


@pytest.fixture
def kernel_registry() -> kernels_registry.KernelRegistry:
    registry = kernels_registry.KernelRegistry()
    registry.register(
        kernels_registry.KernelImpl(
            "silu_and_mul", "torch", reference_silu, frozenset({"cpu"}), frozenset({"float32"})
        )
    )
    return registry


@pytest.fixture
def target_module(tmp_path: Path) -> str:
    (tmp_path / "plugin_kernel_impls.py").write_text("def silu_and_mul(x):\n    return x * 2\n")
    sys.path.insert(0, str(tmp_path))
    return "plugin_kernel_impls"


def declaring(*specs: KernelSpec) -> object:
    class Kernels:
        @hookimpl
        def interlock_kernel_specs(self) -> list[KernelSpec]:
            return list(specs)

    return Kernels()


def kernel(target: str, op: str = "silu_and_mul") -> KernelSpec:
    return KernelSpec(
        op=op,
        backend="doubling",
        target=target,
        platforms={"cpu"},
        dtypes={"float32"},
        plugin_api=">=1.0",
    )


def test_installed_kernels_take_part_in_dispatch(
    register_plugin,
    kernel_registry,  # type: ignore[no-untyped-def]
    target_module,
) -> None:
    register_plugin(declaring(kernel(f"{target_module}:silu_and_mul")), "doubler")
    report = install_plugin_kernels(kernel_registry)
    assert (report.installed, report.failed) == (["silu_and_mul/doubling (doubler)"], [])
    choice = kernel_registry.select("silu_and_mul", "cpu", "float32", preference=["doubling"])
    assert choice.fn(3) == 6
    assert choice.label == "doubling (doubler)"
    again = install_plugin_kernels(kernel_registry)
    assert (again.installed, again.failed) == ([], [])


@pytest.mark.parametrize(
    ("target", "op", "why"),
    [
        ("plugin_kernel_impls:missing", "silu_and_mul", "AttributeError"),
        ("no_such_module_anywhere:fn", "silu_and_mul", "No module named 'no_such_module_anywhere'"),
        ("plugin_kernel_impls:silu_and_mul", "silu_and_mull", "unknown op 'silu_and_mull'"),
    ],
)
def test_a_broken_kernel_is_reported_not_raised(
    register_plugin,
    kernel_registry,  # type: ignore[no-untyped-def]
    target_module,
    target,
    op,
    why,
) -> None:
    register_plugin(declaring(kernel(target, op)), "broken")
    report = install_plugin_kernels(kernel_registry)
    assert report.installed == []
    [failure] = report.failed
    assert failure.startswith(f"{op}/doubling (broken): ") and why in failure
    assert [i.backend for i in kernel_registry.implementations("silu_and_mul")] == ["torch"]


def test_strict_mode_raises(register_plugin, kernel_registry, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    register_plugin(declaring(kernel("no_such_module_anywhere:fn")), "broken")
    # Strict as the run's settings say (INTERLOCK_PLUGINS_STRICT, read where it started).
    with pytest.raises(PluginError, match="plugin broken \\(in-process 0\\): kernel silu_and_mul"):
        install_plugin_kernels(kernel_registry, load_registry(), strict=True)
