"""Issue 24 item 8: ``policy vllm`` takes a model's config.json (vLLM gets the directory) and
a Hugging Face id whose config is in the local Hugging Face cache (read-only, no network);
anything else says which forms there are."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REVISION = "0123456789abcdef0123456789abcdef01234567"
GLM = {"architectures": ["GlmMoeDsaForCausalLM"], "index_topk": 2048, "n_routed_experts": 256}


@pytest.fixture
def hub(tmp_path: Path, monkeypatch) -> Path:
    """A Hugging Face hub cache holding zai-org/GLM-5.2's config.json, laid out as
    huggingface_hub writes it (refs/main, a snapshot whose file links to a blob)."""
    cache = tmp_path / "hf" / "hub"
    repo = cache / "models--zai-org--GLM-5.2"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc123").write_text(json.dumps(GLM))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to("../../blobs/abc123")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return cache


def test_config_json_gives_vllm_the_directory(cli, tmp_path, monkeypatch) -> None:
    (tmp_path / "GLM").mkdir()
    (tmp_path / "GLM" / "config.json").write_text(json.dumps(GLM))
    monkeypatch.chdir(tmp_path)
    res = cli("vllm", "args", "--platform", "rocm", "--json", "GLM/config.json")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["argv"][2] == "./GLM"
    assert doc["resolution"]["context"]["architecture"] == "GlmMoeDsaForCausalLM"


def test_a_cached_hugging_face_id(cli, hub: Path) -> None:
    before = sorted(p for p in hub.rglob("*"))
    res = cli("vllm", "args", "--platform", "rocm", "--device-arch", "gfx950", "--json",
              "zai-org/GLM-5.2", "--tensor-parallel-size", "8")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["argv"][2] == "zai-org/GLM-5.2"  # vLLM resolves the id itself
    context = doc["resolution"]["context"]
    assert context["architecture"] == "GlmMoeDsaForCausalLM"
    assert str(hub / "models--zai-org--GLM-5.2" / "snapshots" / REVISION) in (
        context["sources"]["architecture"]
    )
    assert sorted(p for p in hub.rglob("*")) == before  # read-only


def test_hf_hub_cache_wins_over_hf_home(cli, hub: Path, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    res = cli("vllm", "args", "--platform", "rocm", "zai-org/GLM-5.2")
    assert res.code == 1
    assert f"not in the local Hugging Face cache ({tmp_path / 'elsewhere'})" in res.err


def test_an_uncached_id_says_what_forms_there_are(cli, hub: Path) -> None:
    res = cli("vllm", "args", "--platform", "rocm", "zai-org/GLM-9")
    assert res.code == 1 and "No such file" not in res.err
    assert "not a local path, and not in the local Hugging Face cache" in res.err
    assert "(no network)" in res.err and "a cached Hugging Face id" in res.err


def test_a_missing_path_names_the_forms(cli, tmp_path) -> None:
    res = cli("vllm", "args", "--platform", "rocm", os.fspath(tmp_path / "nope"))
    assert res.code == 1
    assert "does not exist; MODEL is a local model directory" in res.err


def test_demo_is_refused_by_name(cli) -> None:
    res = cli("vllm", "args", "--platform", "cpu", "demo")
    assert res.code == 1 and "vLLM cannot serve it" in res.err
