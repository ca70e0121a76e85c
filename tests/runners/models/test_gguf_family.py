"""A family with GGUF support is still one module: its ``GGUFFacts`` (the
``general.architecture`` name, the q/k permutation, its own config keys) are all the
converter needs to read its files."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gguf_builders import train_vocab, write_tiny_gguf
from safetensors.torch import load_file

from interlock.runners.model import families
from interlock.runners.model import gguf as converter
from interlock.runners.model.config_json import parse_config

TOY_MODULE = textwrap.dedent('''
    """Toy: Llama's layers; llama.cpp would write its files as architecture toyllama."""

    from interlock.runners.model.family import Family, GGUFFacts, window_everywhere

    FAMILIES = (
        Family("ToyLlamaForCausalLM", windows=window_everywhere,
               gguf=GGUFFacts("toyllama", fixed_keys={"sliding_window": 64})),
    )
''')


@pytest.fixture
def toy_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """families/ as if toy_gguf.py had been added to it."""
    folder = tmp_path / "more_families"
    folder.mkdir()
    (folder / "toy_gguf.py").write_text(TOY_MODULE)
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(folder)])
    families.registry.cache_clear()
    families.gguf_registry.cache_clear()
    yield
    families.registry.cache_clear()
    families.gguf_registry.cache_clear()
    sys.modules.pop(f"{families.__name__}.toy_gguf", None)


def test_the_family_module_is_all_its_gguf_files_need(toy_family: None, tmp_path: Path) -> None:
    written = write_tiny_gguf(tmp_path / "toy.gguf", "toyllama", "F32", vocab=train_vocab())
    out = tmp_path / "converted"
    out.mkdir()
    converter.convert(converter.read_gguf(written.path), out)
    raw = json.loads((out / "config.json").read_text())
    assert (raw["architectures"], raw["model_type"], raw["sliding_window"]) == (
        ["ToyLlamaForCausalLM"], "toyllama", 64
    )
    config = parse_config(raw)
    assert config.sliding_windows == (64,) * config.num_layers
    tensors = load_file(out / "model.safetensors")
    assert sorted(tensors) == sorted(written.weights)
    for name, values in written.weights.items():  # not permuted: the family does not say so
        np.testing.assert_array_equal(tensors[name].numpy(), values)


def test_without_the_module_the_architecture_is_refused(tmp_path: Path) -> None:
    written = write_tiny_gguf(tmp_path / "toy.gguf", "toyllama", "F32", vocab=train_vocab())
    with pytest.raises(converter.GGUFError, match="architecture 'toyllama' "
                                                  r"\(general.architecture\) is not supported"):
        converter.read_gguf(written.path)
