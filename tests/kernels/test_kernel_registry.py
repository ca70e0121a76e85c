"""The kernel registry: default preferences, forcing, refusals with reasons, and each
implementation's parameters checked against its op's reference."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from kernel_checks import PLATFORM

import interlock.kernels.triton as triton_kernels
from interlock.core.env import KERNELS
from interlock.kernels import (
    REGISTRY,
    KernelError,
    KernelImpl,
    KernelRegistry,
    KernelSignatureError,
)
from interlock.kernels.native import KERNELS as NATIVE_KERNELS
from interlock.kernels.native import unavailable as native_unavailable

TRITON_OPS = sorted(triton_kernels.KERNELS)


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KERNELS.name, raising=False)


def _impl(op: str, backend: str, **kwargs: object) -> KernelImpl:
    fields = {"platforms": frozenset({"cpu", "cuda"}), "dtypes": frozenset({"float32"})}
    fields.update(kwargs)
    return KernelImpl(op, backend, lambda: backend, **fields)


def test_import_kernels_does_not_import_triton() -> None:
    code = "import sys, interlock.kernels; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("op", TRITON_OPS)
@pytest.mark.parametrize("platform", ["cuda", "rocm", "xpu"])
def test_gpu_platforms_prefer_triton(op: str, platform: str) -> None:
    choice = REGISTRY.select(op, platform, "bfloat16")
    assert choice.impl.backend == "triton"
    assert choice.reason == f"preferred triton on {platform}"


@pytest.mark.parametrize("op", TRITON_OPS)
def test_cpu_never_prefers_triton_even_under_the_interpreter(op: str) -> None:
    choice = REGISTRY.select(op, "cpu", "float32")
    if op in NATIVE_KERNELS and native_unavailable("cpu") is None:
        assert (choice.impl.backend, choice.reason) == ("native", "preferred native on cpu")
    else:
        assert choice.impl.backend == "torch"
        assert choice.reason.startswith("preferred torch on cpu (")


def test_triton_forced_by_the_run_never_by_a_late_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    choice = REGISTRY.select("rms_norm", PLATFORM, "float32", force="triton")
    assert choice.impl.backend == "triton" and choice.reason == "forced triton"
    assert choice.fn.__module__ == "interlock.kernels.triton.norm"
    # $INTERLOCK_KERNELS reaches a selection only with its run (ModelSpec.kernels, read where
    # the run started): one set mid-run changes nothing.
    monkeypatch.setenv(KERNELS.name, "triton")
    assert REGISTRY.select("rms_norm", PLATFORM, "float32").reason != "forced triton"


def test_torch_forced_on_a_gpu_platform() -> None:
    choice = REGISTRY.select("paged_decode_attention", "cuda", "bfloat16", force="torch")
    assert (choice.impl.backend, choice.reason) == ("torch", "forced torch")


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelError, match=r"forced for op 'silu_and_mul': .*need a GPU.*"
                                          r"TRITON_INTERPRET=1"):
        REGISTRY.select("silu_and_mul", "cpu", "float32", force="triton")
    # Unforced, the reason is recorded when a preference passes over it.
    choice = REGISTRY.select("silu_and_mul", "cpu", "float32", preference=["triton", "torch"])
    assert choice.impl.backend == "torch"
    assert "triton kernels need a GPU" in choice.reason


def test_kernels_built_before_the_interpreter_was_enabled_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    runtime = SimpleNamespace(INTERPRETED=False)
    monkeypatch.setitem(sys.modules, "interlock.kernels.triton.runtime", runtime)
    reason = triton_kernels.unavailable("cpu")
    assert reason is not None and "set after the triton kernels were imported" in reason


def test_triton_missing_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_kernels, "_import_failure", lambda: "triton is not importable (x)")
    assert triton_kernels.unavailable("cuda") == "triton is not importable (x)"


def test_a_forced_backend_serves_the_ops_it_has_and_the_rest_say_why_not() -> None:
    registry = KernelRegistry()
    registry.register(_impl("only_torch", "torch"))
    registry.register(_impl("both", "torch"))
    registry.register(_impl("both", "vendor"))
    forced = registry.select("both", "cuda", "float32", force="vendor")
    assert (forced.impl.backend, forced.reason) == ("vendor", "forced vendor")
    other = registry.select("only_torch", "cuda", "float32", force="vendor")
    assert (other.impl.backend, other.reason) == (
        "torch", "preferred torch on cuda (forced vendor has no only_torch; no triton "
        "implementation)")


def test_an_op_exists_only_with_its_torch_reference() -> None:
    registry = KernelRegistry()
    registry.register(_impl("rms_norm", "torch"))
    with pytest.raises(KernelError, match=r"op 'layer_norm' has no torch reference, so "
                                          r"'vendor' \(from acme\) cannot implement it; "
                                          r"known ops: rms_norm"):
        registry.register(_impl("layer_norm", "vendor", provider="acme"))


def test_a_new_reference_op_is_in_every_kernel_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock.kernels.reference import contract
    from interlock.runners.dispatch import build_kernel_table

    monkeypatch.setattr(REGISTRY, "_impls", dict(REGISTRY._impls))
    monkeypatch.setattr(contract, "MODEL_OPS", list(contract.MODEL_OPS))
    monkeypatch.setattr("interlock.runners.dispatch.MODEL_OPS", contract.MODEL_OPS)

    @contract.torch_op("add_one")
    def add_one(x: int) -> int:
        return x + 1

    table = build_kernel_table("cpu", "float32")
    assert table.add_one(1) == 2
    assert table.describe()["add_one"] == (
        "torch (interlock)", "preferred torch on cpu (no native implementation)")
    with pytest.raises(AttributeError,
                       match="no kernel op 'group_norm'; ops: linear, embedding, .*add_one"):
        table.group_norm  # noqa: B018


def test_forcing_an_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(KernelError, match=r"INTERLOCK_KERNELS='cudnn' is not a kernel backend; "
                                          r"known: native, torch, triton"):
        REGISTRY.select("rms_norm", "cuda", "float32", force="cudnn")


def test_forcing_a_backend_that_lacks_the_dtype_names_the_op() -> None:
    registry = KernelRegistry()
    registry.register(_impl("op", "torch"))
    registry.register(_impl("op", "triton"))
    with pytest.raises(KernelError, match=r"forced for op 'op': triton op does not support "
                                          r"bfloat16"):
        registry.select("op", "cuda", "bfloat16", force="triton")


def test_preference_falls_through_with_every_reason() -> None:
    registry = KernelRegistry()
    registry.register(_impl("op", "torch"))
    registry.register(_impl("op", "vendor", platforms=frozenset({"rocm"})))
    choice = registry.select("op", "cuda", "float32", preference=["fast", "vendor", "torch"])
    assert choice.fn() == "torch"
    assert choice.reason == ("preferred torch on cuda (no fast implementation; vendor op does "
                             "not run on cuda)")
    with pytest.raises(KernelError, match=r"no implementation of op 'op' serves cuda/float32"):
        registry.select("op", "cuda", "float32", preference=["vendor"])


def test_duplicate_registration_is_an_error() -> None:
    registry = KernelRegistry()
    registry.register(_impl("op", "torch"))
    registry.register(_impl("op", "triton", provider="interlock"))
    with pytest.raises(KernelError, match=r"op 'op': backend 'triton' registered twice \(by "
                                          r"interlock and acme\)"):
        registry.register(_impl("op", "triton", provider="acme"))


def test_a_plugin_backend_can_be_registered_and_chosen() -> None:
    registry = KernelRegistry()
    registry.register(_impl("op", "torch"))
    registry.register(_impl("op", "vendor", provider="acme-kernels"))
    choice = registry.select("op", "cuda", "float32", preference=["vendor", "torch"])
    assert (choice.fn(), choice.label) == ("vendor", "vendor (acme-kernels)")
    assert registry.backends() == ["torch", "vendor"]


def test_unknown_op_lists_the_known_ops() -> None:
    with pytest.raises(KernelError, match=r"unknown op 'group_norm'; known ops: .*rms_norm"):
        REGISTRY.select("group_norm", "cpu", "float32")


def test_a_lazy_target_that_fails_to_load_names_the_op() -> None:
    registry = KernelRegistry()
    registry.register(_impl("op", "torch"))
    registry.register(KernelImpl("op", "vendor", "no_such_module_xyz:fn", frozenset({"cuda"}),
                                 frozenset({"float32"}), provider="acme"))
    with pytest.raises(KernelError, match=r"op 'op': cannot load vendor implementation "
                                          r"'no_such_module_xyz:fn' from acme"):
        registry.select("op", "cuda", "float32", force="vendor")


def test_every_triton_op_has_a_torch_reference() -> None:
    for op in TRITON_OPS:
        assert {i.backend for i in REGISTRY.implementations(op)} >= {"torch", "triton"}


def reference_norm(x: object, weight: object, eps: float = 1e-6) -> object:
    return x


def missing_eps(x, weight):  # type: ignore[no-untyped-def]
    return x


def renamed_eps(x, weight, epsilon=1e-6):  # type: ignore[no-untyped-def]
    return x


def reordered(weight, x, eps=1e-6):  # type: ignore[no-untyped-def]
    return x


def other_default(x, weight, eps=1e-5):  # type: ignore[no-untyped-def]
    return x


def keyword_eps(x, weight, *, eps=1e-6):  # type: ignore[no-untyped-def]
    return x


def _norm_registry() -> KernelRegistry:
    registry = KernelRegistry()
    registry.register(KernelImpl("norm", "torch", reference_norm, frozenset({"cuda"}),
                                 frozenset({"float32"})))
    return registry


def _where(fn: Callable) -> str:
    return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"


def test_the_reference_states_the_op_signature_without_annotations() -> None:
    assert str(_norm_registry().signature("norm")) == "(x, weight, eps=1e-06)"


def test_an_implementation_taking_the_reference_parameters_registers() -> None:
    def norm(x, weight, eps=1e-6):  # type: ignore[no-untyped-def]  (annotations may differ)
        return weight

    registry = _norm_registry()
    registry.register(KernelImpl("norm", "vendor", norm, frozenset({"cuda"}),
                                 frozenset({"float32"}), provider="acme"))
    assert registry.select("norm", "cuda", "float32", force="vendor").fn is norm


@pytest.mark.parametrize(("fn", "difference"), [
    (missing_eps, "it takes (x, weight): no 'eps'"),
    (renamed_eps, "it takes (x, weight, epsilon=1e-06): 'epsilon' in place of 'eps'"),
    (reordered, "it takes (weight, x, eps=1e-06): the same parameters in another order"),
    (other_default, "'eps' defaults to 1e-05 where the reference's defaults to 1e-06"),
    (keyword_eps, "'eps' is keyword-only where the reference's is positional or keyword"),
])
def test_an_implementation_with_other_parameters_is_refused(
    fn: Callable, difference: str
) -> None:
    registry = _norm_registry()
    with pytest.raises(KernelSignatureError) as refused:
        registry.register(KernelImpl("norm", "vendor", fn, frozenset({"cuda"}),
                                     frozenset({"float32"}), provider="acme"))
    message = str(refused.value)
    assert message.startswith(
        f"op 'norm': vendor implementation {__name__}.{fn.__name__} (from acme) does not take "
        "the op's parameters (x, weight, eps=1e-06): ")
    assert difference in message
    assert message.endswith(f" (at {_where(fn)})")
    assert [i.backend for i in registry.implementations("norm")] == ["torch"]


def test_a_lazy_implementation_is_checked_when_it_loads() -> None:
    registry = _norm_registry()
    registry.register(KernelImpl("norm", "vendor", f"{__name__}:reordered", frozenset({"cuda"}),
                                 frozenset({"float32"}), provider="acme"))
    with pytest.raises(KernelSignatureError, match=r"op 'norm': vendor implementation .*"
                                                   r"reordered \(from acme\) .*another order"):
        registry.select("norm", "cuda", "float32", force="vendor")


def test_a_plugin_kernel_with_other_parameters_is_quarantined_citing_its_line(
    register_plugin: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from interlock.plugins import KernelSpec, hookimpl
    from interlock.plugins.kernels import install_plugin_kernels

    module = tmp_path / "misnamed_kernels.py"
    module.write_text("\n\ndef silu_and_mul(gate_up):\n    return gate_up\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Kernels:
        @hookimpl
        def interlock_kernel_specs(self) -> list[KernelSpec]:
            return [KernelSpec(op="silu_and_mul", backend="vendor",
                               target="misnamed_kernels:silu_and_mul", platforms=("cpu",),
                               dtypes=("float32",), plugin_api=">=1.0")]

    def silu_and_mul(x):  # type: ignore[no-untyped-def]
        return x

    registry = KernelRegistry()
    registry.register(KernelImpl("silu_and_mul", "torch", silu_and_mul, frozenset({"cpu"}),
                                 frozenset({"float32"})))
    register_plugin(Kernels(), "misnamed")
    try:
        report = install_plugin_kernels(registry)
    finally:
        sys.modules.pop("misnamed_kernels", None)
    assert report.installed == []
    assert report.failed == [
        "silu_and_mul/vendor (misnamed): KernelSignatureError: op 'silu_and_mul': vendor "
        "implementation misnamed_kernels.silu_and_mul (from misnamed) does not take the op's "
        "parameters (x): it takes (gate_up): 'gate_up' in place of 'x' "
        f"(at {module}:3)"
    ]


def test_every_shipped_implementation_takes_its_op_parameters() -> None:
    import interlock.runners.mrv2.prepare  # noqa: F401  (registers its op's torch and triton)

    checked = 0
    for op in REGISTRY.ops():
        for impl in REGISTRY.implementations(op):
            # A backend that cannot run anywhere here (not built) may not even import.
            if impl.unavailable is not None and all(map(impl.unavailable, impl.platforms)):
                continue
            REGISTRY.function(impl)  # loads a lazy target, and checks it
            checked += impl.backend != "torch"
    assert checked >= len(TRITON_OPS)
