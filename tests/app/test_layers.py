"""The one-way layers contract (pyproject.toml) catches an upward import, even in a function."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkout import copy_checkout, python_in

pytestmark = pytest.mark.usefixtures("isolated_env")

UPWARD = '''

def _upward():
    # deliberately wrong: the policy engine reaching up into the runners, and into torch
    from interlock.runners import contract
    import torch

    return contract, torch
'''


def test_lint_imports_fails_on_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    root = copy_checkout(tmp_path)
    resolution = root / "policy" / "resolution.py"
    resolution.write_text(resolution.read_text() + UPWARD)
    done = python_in(root, str(root / "tools" / "lint_imports.py"), "--no-cache")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Contracts: 0 kept, 2 broken." in out
    assert "interlock.policy.resolution -> interlock.runners.contract" in out
    assert "interlock.policy.resolution -> torch" in out
