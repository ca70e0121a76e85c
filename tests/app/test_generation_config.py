"""A model's own sampling defaults (``interlock.app.generation_config``), read as vLLM's
server reads them: a model directory's ``generation_config.json``, a GGUF file's
``general.sampling.*`` metadata, or the named model's entry; a bad value is a ModelError
naming where it comes from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf_builders import write_tiny_gguf

from interlock.app.generation_config import generation_defaults
from interlock.core.errors import ModelError


def test_generation_config_json_gives_vllms_fields(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "bos_token_id": 1, "do_sample": True, "temperature": 0.6, "top_p": 0.95,
        "max_new_tokens": 64, "top_k": None}))
    defaults, source = generation_defaults(str(tmp_path), tmp_path)
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "max_tokens": 64}
    assert source == "generation_config.json"


def test_a_directory_without_one_has_none(tmp_path: Path) -> None:
    assert generation_defaults(str(tmp_path), tmp_path) == ({}, None)
    assert generation_defaults("demo", None) == ({}, None)


def test_a_bad_value_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text('{"temperature": -1}')
    with pytest.raises(ModelError, match=r"generation_config.json: .*temperature=-1"):
        generation_defaults(str(tmp_path), tmp_path)
    (tmp_path / "generation_config.json").write_text("[1]")
    with pytest.raises(ModelError, match="expected a JSON object"):
        generation_defaults(str(tmp_path), tmp_path)


def test_gguf_sampling_metadata(tmp_path: Path) -> None:
    # (The builder writes integer metadata: top_k stands for every general.sampling.* key.)
    model = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", "F32",
                            metadata={"general.sampling.top_k": 40})
    defaults, source = generation_defaults(str(model.path), tmp_path)
    assert defaults == {"top_k": 40}
    assert source == "tiny.gguf metadata"


def test_smollm2_carries_its_model_cards_sampling() -> None:
    """The GGUF has no sampling metadata; at vLLM's neutral temperature 1.0 with the whole
    context to fill, the README's first request did not come back in 10 minutes."""
    from interlock.runners.model.checkpoint import resolve_model

    defaults, source = generation_defaults("smollm2", resolve_model("smollm2").directory)
    assert defaults == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 50}
    assert source is not None and "model card" in source
