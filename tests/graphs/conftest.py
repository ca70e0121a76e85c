"""Graph-capture tests: the Triton interpreter on CPU, tiny checkpoints and their oracle.

Triton decides when a kernel module is imported whether its kernels are
compiled or interpreted, so TRITON_INTERPRET is set here, before any test
module imports one (as in tests/kernels).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# The tiny checkpoints of the runners tests, shared rather than rebuilt.
sys.path.insert(0, str(Path(__file__).parents[1] / "runners"))
from graph_cases import Oracle, make_oracle  # noqa: E402
from runner_fixtures import TinyModels  # noqa: E402


@pytest.fixture(scope="session")
def graph_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("graph-checkpoints"))


@pytest.fixture(scope="session")
def llama_oracle(graph_models: TinyModels) -> Oracle:
    return make_oracle(graph_models, "llama")


@pytest.fixture(scope="session")
def moe_oracle(graph_models: TinyModels) -> Oracle:
    return make_oracle(graph_models, "qwen2_moe")
