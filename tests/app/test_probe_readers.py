"""The probe's readers of release-specific vLLM code, on stand-in modules (no vLLM needed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "vllm_probe"

INLINE = '''
import os

class VllmConfig:
    model_config = None

    def __post_init__(self):
        if (
            self.model_config is not None
            and "VLLM_USE_BREAKABLE_CUDAGRAPH" not in os.environ
            and any(a in ("KimiK3ForConditionalGeneration", "KimiLinearForCausalLM")
                    for a in self.model_config.architectures)
        ):
            os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"
        if os.environ.get("X") in ("a", "b"):
            pass
'''


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def probe() -> ModuleType:
    return _load("vllm_probe_under_test", TOOLS / "probe.py")


def test_the_inline_breakable_tuple_is_read_from_post_init(probe, tmp_path: Path) -> None:
    (tmp_path / "fake_config_vllm.py").write_text(INLINE)
    config = _load("fake_config_vllm", tmp_path / "fake_config_vllm.py")
    assert probe.inline_breakable_architectures(config) == [
        "KimiK3ForConditionalGeneration", "KimiLinearForCausalLM",
    ]  # fmt: skip


def test_a_release_without_the_tuple_stops_the_probe_naming_it(probe, tmp_path: Path) -> None:
    (tmp_path / "fake_moved.py").write_text("class VllmConfig:\n    def __post_init__(self):\n"
                                            "        pass\n")
    config = _load("fake_moved", tmp_path / "fake_moved.py")
    with pytest.raises(probe.ProbeError, match="breakable auto-enable of VllmConfig.__post_init__"):
        probe.inline_breakable_architectures(config)


def test_a_moe_architecture_gets_an_expert_count(probe, tmp_path: Path) -> None:
    import json

    dense = json.loads((probe._model_dir(tmp_path, "A") / "config.json").read_text())
    moe = json.loads((probe._model_dir(tmp_path, "B", moe=True) / "config.json").read_text())
    assert "num_local_experts" not in dense
    assert moe["num_local_experts"] > 0 and moe["architectures"] == ["B"]


def test_the_snapshot_takes_moe_from_catalogs_that_agree(tmp_path: Path) -> None:
    sys.path.insert(0, str(TOOLS))
    try:
        snapshot = _load("vllm_snapshot_under_test", TOOLS / "snapshot.py")
    finally:
        sys.path.remove(str(TOOLS))
    base = ("schema_version: 1\nversion: t\ndefaults: {runner: mrv2, cudagraph: none, "
            "breakable: false, compile: true}\ncatalog:\n")
    a_catalog = "  M: {moe: true}\n  D: {moe: false}\n  X: {moe: true}\n"
    (tmp_path / "a.yaml").write_text(base + a_catalog)
    (tmp_path / "b.yaml").write_text(base + "  M: {moe: true}\n  X: {moe: false}\n  U: {}\n")
    paths = [tmp_path / "a.yaml", tmp_path / "b.yaml"]
    assert snapshot.moe_architectures(paths) == ["M"]
