"""`policy model export MODEL DIR` (issue 52 item 2): a GGUF file or a named model written as
a Hugging Face folder of its own, the files a Hugging Face loader reads and nothing of
interlock's (its quantized weights would be read as a second shard), with the `vllm serve`
line that runs it in float32."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gguf_builders import train_vocab, write_tiny_gguf
from safetensors import safe_open

from interlock.commands.model import EXPORTED
from interlock.runners.model.sources import model_directory


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    return Path(write_tiny_gguf(root / "model.gguf", "llama", "Q4_1", vocab=train_vocab()).path)


def test_export_writes_the_float_checkpoint_alone(
    cli: Any, tiny_gguf: Path, tmp_path: Path
) -> None:
    target = tmp_path / "hf"
    result = cli("model", "export", tiny_gguf, target)
    assert result.code == 0, result.err
    assert sorted(p.name for p in target.iterdir()) == sorted(EXPORTED)
    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["torch_dtype"] == "float32"
    # vLLM's --dtype auto downcasts a float32 checkpoint: the line asks for float32.
    assert result.out.splitlines()[-1] == f"vllm serve {target} --dtype float32"
    converted = model_directory(tiny_gguf)
    assert converted is not None and (converted / "quantized.safetensors").exists()
    with safe_open(str(target / "model.safetensors"), "pt") as exported, \
            safe_open(str(converted / "model.safetensors"), "pt") as original:
        assert sorted(exported.keys()) == sorted(original.keys())
    # The folder is a model as it is: interlock itself resolves it.
    doc = cli("explain", "--model", target, "--platform", "cpu", "--json").json()
    assert doc["context"]["architecture"] == "LlamaForCausalLM"


def test_export_refuses_what_it_cannot_write(cli: Any, tiny_gguf: Path, tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    result = cli("model", "export", tiny_gguf, taken)
    assert result.code == 1 and "exists and is not an empty folder" in result.err
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    demo = cli("model", "export", "demo", tmp_path / "demo")
    assert demo.code == 1 and "nothing to export" in demo.err
    assert not (tmp_path / "demo").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("model", "export", tiny_gguf, empty).code == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


@pytest.mark.slow  # converts SmolLM2 on first use (about 540 MB of float32 weights)
def test_the_documented_export_runs_as_written(tmp_path: Path) -> None:
    import os
    import re
    import subprocess
    import sys

    page = (Path(__file__).parents[3] / "docs" / "vllm.md").read_text()
    (block,) = re.findall(r"```console\n\$ (policy model export .*?)```", page, flags=re.S)
    command, *shown = block.rstrip("\n").split("\n")
    bin_dir = os.path.dirname(sys.executable)
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, check=False,
                          env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == shown
