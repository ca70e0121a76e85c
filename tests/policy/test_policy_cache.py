"""The validated-policy cache: warm loads skip YAML and pydantic; bad entries are rebuilt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from interlock.core.disk_cache import cache_dir
from interlock.policy import load_policy, make_context, resolve


def entries() -> list[Path]:
    return sorted(cache_dir().glob("policy-*.entry"))


def test_cache_dir_precedence(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "a"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("INTERLOCK_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "interlock"


def test_cold_then_warm_load_are_equal(write, base) -> None:
    path = write("p.yaml", base)
    cold = load_policy([path])
    assert len(entries()) == 1
    warm = load_policy([path])
    assert warm is not cold
    assert warm.revision == cold.revision
    assert warm.rules == cold.rules and warm.catalog == cold.catalog
    assert not list(cache_dir().glob(".policy-*"))  # no temp file left behind
    ctx = make_context("DsaModel", platform="rocm")
    assert resolve(warm, ctx).to_dict() == resolve(cold, ctx).to_dict()


def test_an_edit_is_a_new_entry(write, base) -> None:
    path = write("p.yaml", base)
    load_policy([path])
    path.write_text(base.replace("mrv2, cudagraph", "mrv1, cudagraph"))
    assert load_policy([path]).defaults["runner"].value == "mrv1"
    assert len(entries()) == 2


@pytest.mark.parametrize("garbage", [b"", b"not an entry", b"\x80\x05K\x01."])
def test_corrupt_entry_is_ignored_and_rebuilt(write, base, garbage: bytes) -> None:
    path = write("p.yaml", base)
    load_policy([path])
    (entry,) = entries()
    entry.write_bytes(garbage)
    policy = load_policy([path])
    assert policy.defaults["runner"].value == "mrv2"
    assert entry.read_bytes() != garbage


def test_unwritable_cache_only_costs_speed(write, base, monkeypatch, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(blocker / "cache"))
    assert load_policy([write("p.yaml", base)]).version == "t1"


def test_errors_are_not_cached(write, base) -> None:
    from interlock.policy import PolicyError

    path = write("p.yaml", base.replace("schema_version: 1", "schema_version: 9"))
    for _ in range(2):
        with pytest.raises(PolicyError, match="newer than this interlock"):
            load_policy([path])
    assert entries() == []


def test_memo_is_not_stored(write, base) -> None:
    path = write("p.yaml", base)
    policy = load_policy([path])
    resolve(policy, make_context("DsaModel", platform="cuda"))
    assert policy.memo
    assert load_policy([path]).memo == {}


WARM = """
import sys
from interlock.cli import main
code = main(["explain", "GlmMoeDsaForCausalLM", "--platform", "rocm", "--gfx", "gfx950"])
heavy = sorted(m for m in ("yaml", "pydantic", "torch") if m in sys.modules)
print("HEAVY", heavy, code)
# Each measurably slows a warm start and has no use on it (BENCHMARKS.md, Policy engine).
slow = ("packaging", "shutil", "traceback", "interlock.policy.source")
print("SLOW", sorted(m for m in slow if m in sys.modules))
"""


def run_python(code: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout


def test_warm_explain_imports_neither_yaml_nor_pydantic_nor_slow_modules(tmp_path) -> None:
    env = {**os.environ, "INTERLOCK_CACHE_DIR": str(tmp_path / "cache")}
    cold = run_python(WARM, env)
    assert "HEAVY ['pydantic', 'yaml'] 0" in cold
    run_python(WARM, env)  # anything else cached on first use is warm now too
    warm = run_python(WARM, env)
    assert "HEAVY [] 0" in warm
    assert "SLOW []" in warm
    assert "rocm-no-default-breakable" in warm
