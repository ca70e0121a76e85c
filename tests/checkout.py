"""This checkout, for the tests that read or copy it: its root and its package layout.

Importable from every test module (pytest puts tests/ on the import path for its conftest).
"""

from __future__ import annotations

import filecmp
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "policies.yaml"
HISTORY = REPO / "examples" / "history"
#: The releases around the seed PRs: 0.27.1 and 0.28.0 before and after #51653 (seed 1),
#: 0.29.0 before #53155 (seed 2), 0.30.0 after it.
BEFORE_51653 = HISTORY / "vllm-0.27.1.yaml"
AFTER_51653 = HISTORY / "vllm-0.28.0.yaml"
BEFORE_53155 = HISTORY / "vllm-0.29.0.yaml"
AFTER_53155 = HISTORY / "vllm-0.30.0.yaml"
#: The state just after vLLM #53155 merged (no release shipped it), the shipped policy
#: until interlock tracked vLLM releases.
SEED_53155 = HISTORY / "2026-09-01-vllm-53155.yaml"
SEED_53155_TESTS = HISTORY / "2026-09-01-vllm-53155.tests.yaml"


def _tools_module(name: str) -> Any:
    """A module of tools/ (the checkout's development scripts, not part of the package)."""
    path = REPO / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"interlock_tools_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: tools/layout.py: which folder of the checkout holds which package (pyproject.toml's mapping).
layout = _tools_module("layout")
#: The checkout's top-level folders that hold the package: interlock/, policy/, runners/, ...
PACKAGE_FOLDERS = sorted({p.relative_to(REPO).parts[0] for p in layout.package_dirs().values()})


def copy_checkout(dest: Path) -> Path:
    """A copy of this checkout's package folders, pyproject.toml and tools/ (what mypy and
    import-linter read); returns ``dest``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    for name in [*PACKAGE_FOLDERS, "tools"]:
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", dest)
    return dest


def copy_package(dest: Path) -> Path:
    """A copy of the ``interlock`` package laid out as an install has it (``interlock/policy/``
    ...) with pyproject.toml beside it; returns ``dest``, to put on PYTHONPATH."""
    return layout.assemble(dest)


def python_in(
    path: Path,
    *args: str,
    cwd: Path | None = None,
    pythonpath: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``python args...`` with ``path`` (then ``pythonpath``) first on the import path, in place
    of the caller's own PYTHONPATH (which points at this checkout)."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update(PYTHONPATH=os.pathsep.join(map(str, [path, *pythonpath])), NO_COLOR="1")
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, *args], cwd=cwd or path, env=environ, capture_output=True, text=True,
        timeout=600,
    )


def changed_files(a: Path, b: Path) -> list[str]:
    """Files that differ between two copies of the package (same files in both), as paths
    ``interlock/...``."""
    compared = filecmp.dircmp(a, b, ignore=["__pycache__"])
    changed: list[str] = []

    def walk(cmp: filecmp.dircmp, prefix: str) -> None:
        assert not cmp.left_only and not cmp.right_only, (cmp.left_only, cmp.right_only)
        changed.extend(f"{prefix}/{name}" for name in cmp.diff_files)
        for name, sub in cmp.subdirs.items():
            walk(sub, f"{prefix}/{name}")

    walk(compared, "interlock")
    return sorted(changed)

#: What the wheel is built from: the package's folders, and the files beside them it needs.
WHEEL_SOURCES = (
    "pyproject.toml", "README.md", "policies.yaml", "examples/vllm-all-releases.yaml",
    "examples/sglang.yaml",
    *PACKAGE_FOLDERS,
)
