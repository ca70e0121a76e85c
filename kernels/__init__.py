"""Model ops: torch references, Triton kernels, and the registry that picks between them."""

from __future__ import annotations

if __name__ == "kernels":  # the checkout root on sys.path: see core/bare_name.py
    from interlock.core.bare_name import hand_over

    hand_over(__name__, __file__)
else:
    from interlock.kernels import native as _native  # noqa: F401  (registers the native CPU ops, lazily)
    from interlock.kernels import triton as _triton  # noqa: F401  (registers the Triton ops, lazily)
    from interlock.kernels.reference import MODEL_OPS  # (registers the torch reference ops)
    from interlock.kernels.registry import (
        REGISTRY,
        KernelChoice,
        KernelError,
        KernelImpl,
        KernelRegistry,
        KernelSignatureError,
    )

    __all__ = [
        "MODEL_OPS", "REGISTRY", "KernelChoice", "KernelError", "KernelImpl", "KernelRegistry",
        "KernelSignatureError",
    ]
