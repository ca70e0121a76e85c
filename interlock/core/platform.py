"""Which accelerator this process sees; the only place the lower layers touch torch."""

from __future__ import annotations


def detect_platform() -> tuple[str, str, str]:
    """``(platform, device_arch, how)``; imports torch, and only here. No torch -> ``cpu``."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "cpu", "", "torch is not installed"
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        if getattr(torch.version, "hip", None):
            gfx = str(getattr(props, "gcnArchName", "")).split(":")[0]
            return "rocm", gfx, f"torch {torch.__version__} HIP, {props.name}"
        return (
            "cuda",
            f"sm_{props.major}{props.minor}",
            f"torch {torch.__version__} CUDA, {props.name}",
        )
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu", "", f"torch {torch.__version__} XPU"
    return "cpu", "", f"torch {torch.__version__} sees no accelerator"
