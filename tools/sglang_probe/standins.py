"""Stand-in GPUs for SGLang's config path on a CPU machine (runs inside the .sglang venv).

SGLang reads its platform from torch (``torch.version.cuda``/``hip``,
``torch.cuda.is_available``, the device's capability, name and memory) and from the
vendor tools on PATH (``nvidia-smi``, ``rocminfo``), and imports a few GPU-only
packages on the way to ``ServerArgs.resolve_once()``. :func:`install` answers each of
those for one named GPU, before SGLang is imported:

- torch's device queries answer for the GPU (``GPUS``);
- a folder of fake ``nvidia-smi`` / ``rocminfo`` goes first on PATH, answering the
  memory, compute capability and driver queries SGLang runs;
- ``sgl_kernel``, ``pynvml``, ``aiter``, ``amdsmi`` (GPU builds only) and ``torchvision``
  (the only builds reachable here are CUDA builds that fail to load beside CPU torch)
  import as empty modules whose attributes are further empty modules. torchvision's is
  installed only after transformers has looked for the real one, so transformers still
  sees no torchvision and takes its no-torchvision paths.

On ``cpu`` no GPU is faked: ``SGLANG_USE_CPU_ENGINE=1`` selects SGLang's own CPU platform.
Nothing here decides anything: SGLang's own code does, on what these answer.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import shutil
import stat
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

#: The stand-in GPUs: what torch and the vendor tools answer for each (platform, device arch).
GPUS: dict[tuple[str, str], dict[str, Any]] = {
    ("cuda", "sm_90"): {"name": "NVIDIA H100 80GB HBM3", "capability": (9, 0), "gib": 80},
    ("cuda", "sm_100"): {"name": "NVIDIA B200", "capability": (10, 0), "gib": 180},
    ("rocm", "gfx942"): {"name": "AMD Instinct MI300X", "capability": (9, 4), "gib": 192},
    ("rocm", "gfx950"): {"name": "AMD Instinct MI355X", "capability": (9, 5), "gib": 288},
}
#: Every platform the probe runs: the stand-in GPUs and SGLang's own CPU platform.
PLATFORMS: tuple[tuple[str, str], ...] = (*GPUS, ("cpu", ""))

#: GPU-only packages SGLang imports on its config path: empty stand-ins.
GPU_ONLY_MODULES = {"sgl_kernel", "pynvml", "aiter", "amdsmi"}


class _Empty(types.ModuleType):
    """A module whose every public attribute is another empty module (callable)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        child = _Empty(f"{self.__name__}.{name}")
        setattr(self, name, child)
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self


class _EmptyModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return _Empty(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []


def _tools(platform: str, gpu: dict[str, Any]) -> Path:
    """A folder with the vendor tool SGLang shells out to, answering for ``gpu``."""
    folder = Path(tempfile.mkdtemp(prefix="sglang-standin-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    mib = gpu["gib"] * 1024
    if platform == "cuda":
        major, minor = gpu["capability"]
        script = (
            '#!/bin/sh\ncase "$*" in\n'
            f'  *memory.total*) echo {mib} ;;\n'
            f'  *compute_cap*) echo {major}.{minor} ;;\n'
            '  *driver_version*) echo 580.00.00 ;;\n'
            '  *) exit 1 ;;\nesac\n'
        )
        name = "nvidia-smi"
    else:
        # SGLang reads the size of the GPU agent's pool 1, in KB.
        script = (
            "#!/bin/sh\ncat <<'EOF'\n"
            f"  Name:                    {gpu['arch']}\n"
            "  Pool Info:\n    Pool 1\n"
            "      Segment:                 GLOBAL; FLAGS: COARSE GRAINED\n"
            f"      Size:                    {mib * 1024}(0x0) KB\nEOF\n"
        )
        name = "rocminfo"
    path = folder / name
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def install(platform: str, device_arch: str) -> None:
    """Make this process look like ``platform``/``device_arch`` to SGLang (before its import)."""
    finder = _EmptyModules(set(GPU_ONLY_MODULES))
    sys.meta_path.insert(0, finder)
    import torch
    import transformers.utils.import_utils  # noqa: F401  (looks for torchvision now, finds none)

    finder.names.add("torchvision")
    if platform == "cpu":
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
        return
    gpu = {**GPUS[(platform, device_arch)], "arch": device_arch}
    major, minor = gpu["capability"]
    props = types.SimpleNamespace(
        name=gpu["name"],
        gcnArchName=f"{device_arch}:sramecc+:xnack-" if platform == "rocm" else "",
        total_memory=gpu["gib"] << 30,
        major=major,
        minor=minor,
        multi_processor_count=132 if platform == "cuda" else 304,
        L2_cache_size=50 << 20,
    )
    torch.version.cuda = "13.0" if platform == "cuda" else None  # type: ignore[misc]
    torch.version.hip = "7.0.0" if platform == "rocm" else None  # type: ignore[misc]
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.is_initialized = lambda: False
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    torch.cuda.get_device_properties = lambda device=None: props
    torch.cuda.get_device_name = lambda device=None: gpu["name"]
    torch.cuda.mem_get_info = lambda device=None: (gpu["gib"] << 30, gpu["gib"] << 30)
    os.environ["PATH"] = f"{_tools(platform, gpu)}{os.pathsep}{os.environ.get('PATH', '')}"
