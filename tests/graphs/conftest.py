"""Graph-capture tests: the Triton interpreter on CPU, tiny checkpoints and their oracle.

Triton decides when a kernel module is imported whether its kernels are
compiled or interpreted, so TRITON_INTERPRET is set here, before any test
module imports one (as in tests/kernels).
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
