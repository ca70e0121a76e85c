"""The platforms interlock knows, what each one is, and which one this process sees.

The one place the platform vocabulary is spelled out: the names, the torch device type
each runs on, and the facts the layers above read from it (where Triton kernels are the
default, where CUDA graphs and torch.compile are honoured, the torch.distributed backend
of tensor parallelism). Adding a platform is an entry in :data:`PLATFORMS` (and its
detection in :func:`detect_platform`), plus what the platform itself needs (kernels, a
graph backend). Torch is imported only to detect the platform.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The context fact saying whether Triton kernels can run on the platform: what a runner may
#: require (``PlatformSupport.requires``), what the context probes, and, under vLLM, what
#: the engine's own environment says. The one spelling of its name.
TRITON_FACT = "has_triton"


@dataclass(frozen=True)
class Platform:
    name: str  # as contexts, rules and runner declarations name it
    device_type: str  # the torch device type it runs on
    #: Whether its kernels are GPU kernels: Triton is the preferred kernel backend, and
    #: input preparation on the device (mrv2) needs it.
    gpu: bool
    #: Whether the built-in runners' graphs are CUDA graphs and honour torch.compile.
    compiled_graphs: bool
    #: The torch.distributed backend of tensor-parallel collectives (None: none here).
    distributed_backend: str | None
    #: Whether torch reports it as a HIP build of its device type (ROCm is ``cuda``).
    hip: bool = False


#: Every built-in platform, in the order tables and listings show them.
PLATFORMS: Mapping[str, Platform] = {
    p.name: p
    for p in (
        Platform("cuda", "cuda", gpu=True, compiled_graphs=True, distributed_backend="nccl"),
        # torch's ROCm builds serve NCCL with RCCL
        Platform("rocm", "cuda", gpu=True, compiled_graphs=True, distributed_backend="nccl",
                 hip=True),
        Platform("xpu", "xpu", gpu=True, compiled_graphs=False, distributed_backend=None),
        Platform("cpu", "cpu", gpu=False, compiled_graphs=False, distributed_backend="gloo"),
    )
}
PLATFORM_NAMES: tuple[str, ...] = tuple(PLATFORMS)
GPU_PLATFORMS: tuple[str, ...] = tuple(p.name for p in PLATFORMS.values() if p.gpu)


def device_for(platform: str) -> str:
    """The torch device type that runs a model on ``platform`` (ROCm is ``cuda`` to torch)."""
    known = PLATFORMS.get(platform)
    if known is None:
        raise ValueError(
            f"platform {platform!r} has no torch device here; allowed: {', '.join(PLATFORMS)}"
        )
    return known.device_type


def platform_of_device(device_type: str, hip: bool = False) -> str:
    """The platform a torch device type runs (``hip``: torch is a HIP build)."""
    matching = [p for p in PLATFORMS.values() if p.device_type == device_type]
    chosen = [p for p in matching if p.hip == hip] if len(matching) > 1 else matching
    if not chosen:
        allowed = ", ".join(dict.fromkeys(p.device_type for p in PLATFORMS.values()))
        raise ValueError(f"device type {device_type!r} is not supported; allowed: {allowed}")
    return chosen[0].name


def platform_named_by_device(device_type: str) -> str | None:
    """The platform a device type names by itself, or None when several share it (``cuda``
    is CUDA or ROCm: only detection tells) or none does."""
    matching = [p.name for p in PLATFORMS.values() if p.device_type == device_type]
    return matching[0] if len(matching) == 1 else None


def distributed_backend(device_type: str) -> str | None:
    """The torch.distributed backend of tensor parallelism on a torch device type."""
    backends = {p.distributed_backend for p in PLATFORMS.values() if p.device_type == device_type}
    return backends.pop() if len(backends) == 1 else None


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


#: How the device architectures of a platform are named, where the names are known: the
#: pattern a name matches, an example, and real names to suggest from.
@dataclass(frozen=True)
class ArchNames:
    pattern: str
    example: str
    known: tuple[str, ...]


DEVICE_ARCHS: Mapping[str, ArchNames] = {
    "cuda": ArchNames(r"sm_[0-9]+[a-z]?", "sm_90", (
        "sm_70", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100",
        "sm_100a", "sm_101", "sm_103", "sm_110", "sm_120", "sm_121")),
    "rocm": ArchNames(r"gfx[0-9a-f]+", "gfx942", (
        "gfx900", "gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950",
        "gfx1030", "gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201")),
}


def platform_problem(name: str, declared: Iterable[str] = ()) -> str | None:
    """Why ``name`` is not a platform (the built-in ones, or ``declared`` by plugins), with
    the closest known name; None when it is one."""
    from interlock.core.suggest import hint

    known = [*PLATFORM_NAMES, *(p for p in declared if p not in PLATFORMS)]
    if name in known:
        return None
    return (
        f"unknown platform {name!r}; known: {', '.join(known)} (a plugin may declare a new "
        f"one){hint(name, known)}"
    )


def device_arch_problem(arch: str, platforms: Iterable[str]) -> str | None:
    """Why ``arch`` (a name or a glob) names no device architecture of any of ``platforms``,
    with the closest real name; None when it may, or when one of the platforms' names are
    not known (``cpu``, a plugin's platform): nothing to check then."""
    import re

    from interlock.core.suggest import hint

    platforms = list(platforms)
    if not arch or not platforms or any(p not in DEVICE_ARCHS for p in platforms):
        return None
    forms = [DEVICE_ARCHS[p] for p in platforms]
    literal = re.split(r"[*?\[]", arch, maxsplit=1)[0]
    for form in forms:
        if re.fullmatch(form.pattern, literal):
            return None
        # A glob's fixed part is a prefix of a name: "gfx9*", "sm_1*".
        if literal != arch and re.fullmatch(form.pattern, literal + "0"):
            return None
    names = " or ".join(f"{f.pattern.split('[')[0]}…, e.g. {f.example}" for f in forms)
    known = [k for f in forms for k in f.known]
    return (
        f"device arch {arch!r} is not a {'/'.join(platforms)} architecture name ({names})"
        + hint(arch, known)
    )
