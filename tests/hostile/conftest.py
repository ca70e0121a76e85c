"""Fixtures for the hostile-input tests: an isolated cache and environment per test."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from plugin_builders import make_dist

from interlock import plugins
from interlock.core import disk_cache


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("INTERLOCK_POLICY", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    # The "running without the cache" notice is said once per process; each test is one.
    monkeypatch.setattr(disk_cache, "_warned", False)
    monkeypatch.setattr(disk_cache, "_refused", None)
    for name in (
        "INTERLOCK_DISABLE_PLUGINS",
        "INTERLOCK_PLUGINS_STRICT",
        "INTERLOCK_NO_PLUGIN_CACHE",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def install(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """install(dist, entry_points, modules): an installed-looking distribution on sys.path for
    one test (the plugin registry is rediscovered)."""
    path = list(sys.path)
    site = tmp_path / "site"

    def _install(dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> Path:
        make_dist(site, dist, "1.0", entry_points, modules)
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
        plugins.reset()
        return site

    yield _install
    sys.path[:] = path
    for name in [m for m in sys.modules if m.startswith("hostile_")]:
        del sys.modules[name]
    plugins.reset()


POLICY = """\
schema_version: 1
version: "h1"
catalog:
  DsaModel: {moe: true, attention: dsa}
  DenseModel: {moe: false, attention: gqa}
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
env:
  USE_V2: {field: runner, values: {"0": mrv1, "1": mrv2}}
rules:
  - id: dsa-on-mrv1
    when: {attention: dsa, features: {tensor_parallel_size: {gt: 1}}}
    set: {runner: mrv1}
    reason: a reason long enough to pass
"""


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY)
    return path


TINY = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """A tiny Llama checkpoint (config.json + model.safetensors) a test may damage."""
    import json

    from safetensors.torch import save_file

    from interlock.runners.dispatch import build_kernel_table
    from interlock.runners.model.checkpoint import build_model
    from interlock.runners.model.config import parse_config
    from interlock.runners.model.dummy import DummyTensors
    from interlock.runners.model.weights import checkpoint_shapes

    directory = tmp_path / "tiny"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(TINY))
    model = build_model(
        parse_config(TINY), build_kernel_table("cpu", "float32"), "float32", "meta", 64
    )
    shapes = checkpoint_shapes(model)
    tensors = DummyTensors(shapes, 0, 0.1)
    save_file({n: tensors.get(n) for n in shapes}, directory / "model.safetensors")
    return directory
