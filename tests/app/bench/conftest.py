"""Bench tests: a tiny dummy-weight Llama and the delay plugin registered for each test."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from interlock import plugins
from interlock.plugins.manager import add_plugin, remove_plugin

sys.path.insert(0, str(Path(__file__).parent))
from delay_plugin import DelayPlugin  # noqa: E402

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
    "torch_dtype": "float32",
}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config.json only: run with load_format="dummy" (speed does not depend on weights)."""
    path = tmp_path_factory.mktemp("tiny-bench-model")
    (path / "config.json").write_text(json.dumps(TINY_CONFIG))
    return path


@pytest.fixture(scope="module", autouse=True)
def delay_runners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The runners fast, slow and rigid registered for the module; a private cache; one
    torch thread (the tiny model gains nothing from two, and on a busy machine they wait
    for each other). Module-scoped so that a module can measure once and check often."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        patch.delenv("INTERLOCK_POLICY", raising=False)
        plugins.reset()
        add_plugin(DelayPlugin(), "delay", distribution="tests", version="0")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)
        remove_plugin("delay")
        plugins.reset()
