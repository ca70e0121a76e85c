"""The demo model's name is spelled once (runners.model.sources.DEMO) and resolves, like
every other model target, through the one resolution (sources.model_directory)."""

from __future__ import annotations

import ast
from pathlib import Path

from interlock.app.query import model_target
from interlock.runners.model.checkpoint import resolve_model
from interlock.runners.model.sources import DEMO, model_directory

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("interlock", "core", "policy", "runners", "kernels", "plugins")


def test_the_demo_name_is_a_string_in_one_module() -> None:
    where = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for top in SOURCES for path in (REPO / top).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant) and node.value == DEMO
    ]
    assert len(where) == 1 and where[0].startswith("runners/model/sources.py:"), where


def test_every_view_of_a_target_agrees(tmp_path: Path) -> None:
    assert model_directory(DEMO) is None
    assert model_target(DEMO) == DEMO == resolve_model(DEMO).name
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert model_directory(tmp_path / "config.json") == tmp_path
    assert model_target(tmp_path / "config.json") == str(tmp_path)
