"""This checkout, for the tests that read or copy it: its root and its package layout.

Importable from every test module (pytest puts tests/ on the import path for its conftest).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


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
