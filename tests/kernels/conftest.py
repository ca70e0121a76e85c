"""Kernel tests: Triton kernels against their torch references.

Without a GPU the kernels run in Triton's interpreter on CPU tensors. Triton
reads TRITON_INTERPRET when a kernel is decorated, i.e. when its module is
first imported, so it is set here, before any test module can import one.
With a GPU (and TRITON_INTERPRET unset) the same tests run the compiled
kernels on the device.
"""

from __future__ import annotations

import os


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


if "TRITON_INTERPRET" not in os.environ and not _has_gpu():
    os.environ["TRITON_INTERPRET"] = "1"
