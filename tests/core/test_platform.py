"""The platform vocabulary is spelled out once, in interlock.core.platform, and the
device <-> platform mapping is read from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from interlock.core.platform import (
    GPU_PLATFORMS,
    PLATFORM_NAMES,
    PLATFORMS,
    device_for,
    distributed_backend,
    platform_named_by_device,
    platform_of_device,
)

REPO = Path(__file__).resolve().parents[2]
#: The package's source folders.
SOURCES = ("interlock", "core", "policy", "runners", "kernels", "plugins")
HOME = REPO / "core" / "platform.py"


def _source_files() -> list[Path]:
    return [path for top in SOURCES for path in (REPO / top).rglob("*.py")]


def _platform_collections(path: Path) -> list[str]:
    """Tuples, lists and sets of string literals naming two or more platforms."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts
                     if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len([n for n in names if n in PLATFORMS]) >= 2:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_platform_tuple_is_spelled_only_in_core_platform() -> None:
    files = _source_files()
    assert HOME in files and len(files) > 100
    spelled = [hit for path in files if path != HOME for hit in _platform_collections(path)]
    assert spelled == []


def test_the_check_sees_a_spelled_out_platform_set(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('GPU = ("cuda", "rocm")\nif kind in {"cpu", "xpu"}:\n    pass\n')
    assert len(_platform_collections(planted)) == 2


def test_the_vocabulary() -> None:
    assert PLATFORM_NAMES == ("cuda", "rocm", "xpu", "cpu")
    assert GPU_PLATFORMS == ("cuda", "rocm", "xpu")


@pytest.mark.parametrize(("platform", "device"),
                         [("cuda", "cuda"), ("rocm", "cuda"), ("xpu", "xpu"), ("cpu", "cpu")])
def test_device_and_platform_map_both_ways(platform: str, device: str) -> None:
    assert device_for(platform) == device
    assert platform_of_device(device, hip=PLATFORMS[platform].hip) == platform


def test_a_device_type_names_a_platform_only_when_no_other_shares_it() -> None:
    assert platform_named_by_device("cpu") == "cpu"
    assert platform_named_by_device("xpu") == "xpu"
    assert platform_named_by_device("cuda") is None  # CUDA or ROCm: detection tells


def test_unknown_platforms_and_devices_are_errors_naming_the_allowed() -> None:
    with pytest.raises(ValueError, match="platform 'tpu' has no torch device here; allowed: "
                                         "cuda, rocm, xpu, cpu"):
        device_for("tpu")
    with pytest.raises(ValueError, match="device type 'mps' is not supported; allowed: "
                                         "cuda, xpu, cpu"):
        platform_of_device("mps")


def test_tensor_parallel_backends() -> None:
    assert distributed_backend("cpu") == "gloo"
    assert distributed_backend("cuda") == "nccl"
    assert distributed_backend("xpu") is None
