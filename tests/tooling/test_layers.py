"""The one-way layers contract (pyproject.toml) catches an upward import, even in a function."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .conftest import copy_package, python_in

UPWARD = '''

def _upward():
    # deliberately wrong: the policy engine reaching up into the runners, and into torch
    from interlock.runners import contract
    import torch

    return contract, torch
'''


def test_lint_imports_fails_on_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    resolution = root / "interlock" / "policy" / "resolution.py"
    resolution.write_text(resolution.read_text() + UPWARD)
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports is not None, "import-linter is in the test extra"
    done = python_in(root, lint_imports, "--no-cache")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Contracts: 0 kept, 2 broken." in out
    assert "interlock.policy.resolution -> interlock.runners.contract" in out
    assert "interlock.policy.resolution -> torch" in out
