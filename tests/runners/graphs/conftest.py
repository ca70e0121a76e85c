"""Graph-capture tests: the Triton interpreter on CPU, tiny checkpoints and their oracle.

Triton decides when a kernel module is imported whether its kernels are
compiled or interpreted, so TRITON_INTERPRET is set here, before any test
module imports one (as in tests/kernels).
"""

from __future__ import annotations

import os

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from graph_cases import Oracle, make_oracle  # noqa: E402
from tiny_models import TinyModels  # noqa: E402


@pytest.fixture(scope="session")
def graph_models(tiny_models: TinyModels) -> TinyModels:
    """The tiny checkpoints of the runners tests, shared rather than rebuilt."""
    return tiny_models


@pytest.fixture(scope="session")
def llama_oracle(graph_models: TinyModels) -> Oracle:
    return make_oracle(graph_models, "llama")


@pytest.fixture(scope="session")
def moe_oracle(graph_models: TinyModels) -> Oracle:
    return make_oracle(graph_models, "qwen2_moe")
