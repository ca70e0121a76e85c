"""Plugin kernels from the user's side: installed by interlock (not by a runner) before any
runner loads, so built-in runners dispatch to them when their backend is forced, a broken
one is quarantined (or stops the run in strict mode), and `policy run` shows the choice."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from interlock.cli import main
from interlock.kernels import REGISTRY, KernelError
from interlock.kernels.native import unavailable as native_unavailable
from interlock.llm import LLM
from interlock.plugins import KernelSpec, PluginError, hookimpl
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.testing.checks import TINY_PROMPTS

BACKEND = "sliced"
# The built-in backend a float32 CPU run prefers for the ops the native kernels implement.
CPU = "torch" if native_unavailable("cpu") else "native"
KERNEL_MODULE = '''
import torch

def silu_and_mul(x):
    half = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :half]) * x[..., half:]
'''


@pytest.fixture(autouse=True)
def fresh_kernel_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed kernels stay in the process's registry: give each test its own copy (after
    mrv2 registered its input-preparation op, which it does once, on import)."""
    import interlock.runners.mrv2.prepare  # noqa: F401

    monkeypatch.setattr(REGISTRY, "_impls", {op: list(i) for op, i in REGISTRY._impls.items()})
    monkeypatch.delenv("INTERLOCK_KERNELS", raising=False)


@pytest.fixture
def kernel_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "sliced_kernels.py").write_text(KERNEL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "sliced_kernels"
    sys.modules.pop("sliced_kernels", None)


def declaring(target: str) -> object:
    class Kernels:
        @hookimpl
        def interlock_kernel_specs(self) -> list[KernelSpec]:
            return [KernelSpec(op="silu_and_mul", backend=BACKEND, target=target,
                               platforms=("cpu",), dtypes=("float32",), plugin_api=">=1.0")]

    return Kernels()


def generate(model: Path, runner: str) -> tuple[list[tuple[int, ...]], dict[str, tuple[str, str]]]:
    llm = LLM(model, load_format="dummy", dtype="float32", device="cpu", max_model_len=64,
              max_num_seqs=4, decision=Decision(runner=runner, cudagraph="none"))
    outputs = llm.generate(list(TINY_PROMPTS), SamplingParams(temperature=0, max_tokens=4))
    return ([o.token_ids for o in outputs],
            {k.op: (k.implementation, k.reason) for k in llm.report().kernels})


@pytest.mark.parametrize("runner", ["mrv1", "mrv2"])
def test_a_builtin_runner_dispatches_to_a_forced_plugin_backend(
    runner, register_plugin, kernel_module, tiny_model, monkeypatch
):
    register_plugin(declaring(f"{kernel_module}:silu_and_mul"), "slicer")
    expected, _ = generate(tiny_model, runner)

    monkeypatch.setenv("INTERLOCK_KERNELS", BACKEND)
    tokens, kernels = generate(tiny_model, runner)

    assert kernels["silu_and_mul"] == (f"{BACKEND} (slicer)", f"forced {BACKEND}")
    # The ops the plugin does not implement keep their usual choice, and say why.
    assert kernels["rms_norm"] == (
        f"{CPU} (interlock)", f"preferred {CPU} on cpu (forced {BACKEND} has no rms_norm)")
    assert tokens == expected


def test_a_broken_kernel_spec_is_left_out_with_a_warning(
    register_plugin, tiny_model, monkeypatch, caplog
):
    register_plugin(declaring("no_such_kernel_module:silu_and_mul"), "broken")
    with caplog.at_level(logging.WARNING, logger="interlock"):
        _, kernels = generate(tiny_model, "mrv1")
    assert kernels["silu_and_mul"][0] == f"{CPU} (interlock)"
    assert "plugin kernel not installed: silu_and_mul/sliced (broken): " in caplog.text
    assert "No module named 'no_such_kernel_module'" in caplog.text
    # Forcing its backend then names the backends that do exist.
    monkeypatch.setenv("INTERLOCK_KERNELS", BACKEND)
    with pytest.raises(KernelError, match=f"INTERLOCK_KERNELS='{BACKEND}' is not a kernel "
                                          "backend; known: native, torch, triton"):
        generate(tiny_model, "mrv1")


def test_strict_mode_stops_at_a_broken_kernel_spec(register_plugin, tiny_model, monkeypatch):
    register_plugin(declaring("no_such_kernel_module:silu_and_mul"), "broken")
    monkeypatch.setenv("INTERLOCK_PLUGINS_STRICT", "1")
    with pytest.raises(PluginError, match=r"INTERLOCK_PLUGINS_STRICT=1: plugin broken .*: "
                                          r"kernel silu_and_mul/sliced \(broken\): .*"
                                          "no_such_kernel_module"):
        generate(tiny_model, "mrv1")


def test_policy_run_reports_the_plugin_kernel(register_plugin, kernel_module, monkeypatch,
                                              capsys):
    register_plugin(declaring(f"{kernel_module}:silu_and_mul"), "slicer")
    monkeypatch.setenv("INTERLOCK_KERNELS", BACKEND)
    assert main(["run", "--model", "demo", "--max-tokens", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kernels"]["silu_and_mul"] == f"{BACKEND} (slicer)"
    assert doc["kernels"]["rms_norm"] == f"{CPU} (interlock)"
