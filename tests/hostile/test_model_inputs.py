"""Items 2, 5, 6, 7, 8, 17, 21, 28 and 32 of the hostile-inputs issue: checkpoints,
config.json and tokenizer files are untrusted."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from interlock.core.errors import ModelError
from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision


def generate(model: Path, **kw: object) -> tuple[int, ...]:
    llm = LLM(
        str(model),
        decision=Decision(runner="mrv1", cudagraph="none"),
        device="cpu",
        num_blocks=8,
        max_model_len=32,
        **kw,
    )
    return llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2))[0].token_ids


def shard(model: Path, weight_map: dict[str, object]) -> None:
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def every_tensor(model: Path, file: object) -> dict[str, object]:
    return dict.fromkeys(load_file(model / "model.safetensors"), file)


@pytest.mark.parametrize("target", ["absolute", "dotdot", "symlink"])
def test_02_shard_paths_cannot_leave_the_model_directory(tiny_model, tmp_path, target) -> None:
    secret = tmp_path / "secret.safetensors"
    os.replace(tiny_model / "model.safetensors", secret)
    name = {"absolute": str(secret), "dotdot": "../secret.safetensors", "symlink": "link"}[target]
    if target == "symlink":
        (tiny_model / "link").symlink_to(secret)
    shard(tiny_model, dict.fromkeys(load_file(secret), name))
    with pytest.raises(ModelError, match="outside the model directory"):
        generate(tiny_model)


def test_02_hf_cache_snapshot_links_into_blobs_are_inside(tiny_model, tmp_path) -> None:
    repo = tmp_path / "models--x--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        os.replace(tiny_model / name, repo / "blobs" / name)
        (snapshot / name).symlink_to(Path("../../blobs") / name)
    assert len(generate(snapshot)) == 2


@pytest.mark.parametrize("damage", [b"", b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json", "cut"])
def test_05_damaged_safetensors_is_a_clear_error(tiny_model, damage) -> None:
    path = tiny_model / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100] if damage == "cut" else damage)
    with pytest.raises(ModelError, match="model.safetensors: not a readable safetensors file"):
        generate(tiny_model)


def test_05_cli_damaged_safetensors_exits_4_without_traceback(tiny_model, cli) -> None:
    (tiny_model / "model.safetensors").write_bytes(b"garbage")
    res = cli("run", "--model", tiny_model, "--max-tokens", "1", "--set", "cudagraph=none")
    assert res.code == 4 and "Traceback" not in res.err
    assert "not a readable safetensors file" in res.err


def test_06_bad_shard_index_values(tiny_model) -> None:
    tensors = every_tensor(tiny_model, "model.safetensors")
    first = next(iter(tensors))
    shard(tiny_model, {**tensors, first: 7})
    with pytest.raises(ModelError, match=rf"weight_map\['{first}'\]: a shard must be a file"):
        generate(tiny_model)
    # A tensor the index puts in a shard that does not hold it.
    data = load_file(tiny_model / "model.safetensors")
    data.pop(first)
    save_file(data, tiny_model / "other.safetensors")
    shard(tiny_model, {**tensors, first: "other.safetensors"})
    with pytest.raises(ModelError, match=rf"other.safetensors: tensor {first}: "):
        generate(tiny_model)


@pytest.mark.parametrize("command", ["explain", "run"])
@pytest.mark.parametrize("content", ["latin1", "deep"])
def test_07_config_json_not_utf8_or_too_deep(tiny_model, cli, command, content) -> None:
    data = (
        b'{"architectures": ["Llama\xe9"]}'
        if content == "latin1"
        else b"[" * 100_000 + b"]" * 100_000
    )
    (tiny_model / "config.json").write_bytes(data)
    argv = (
        ["explain", "--model", tiny_model, "--platform", "cpu"]
        if command == "explain"
        else ["run", "--model", tiny_model]
    )
    res = cli(*argv)
    assert res.code in (1, 4) and "Traceback" not in res.err
    expected = "not UTF-8 (byte 0xe9)" if content == "latin1" else "nested too deeply"
    assert expected in res.err
    assert ("config.json:1:26" if content == "latin1" else "config.json") in res.err


def test_08_garbage_tokenizer_json(tiny_model, cli) -> None:
    (tiny_model / "tokenizer.json").write_text('{"model": "not a tokenizer"}')
    with pytest.raises(ModelError, match="tokenizer.json: not a tokenizer"):
        generate(tiny_model)
    res = cli("run", "--model", tiny_model, "--prompt", "hi")
    assert res.code == 4 and "Traceback" not in res.err


def _rope_case(kind: str) -> dict[str, object]:
    return {
        "default": {"rope_type": "default"},
        "linear": {"rope_type": "linear", "factor": 8.0},
        "llama3": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    }[kind]


@pytest.mark.parametrize("kind", ["default", "linear", "llama3", "yarn"])
def test_17_rope_scaling_wins_over_rope_parameters_as_in_transformers(kind) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from interlock.runners.model.config_json import parse_config
    from interlock.runners.model.rope import inverse_frequencies
    from interlock.testing.checks import TINY_LLAMA as TINY

    raw = {
        **TINY,
        "rope_scaling": _rope_case(kind),
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    }
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]  # transformers' rotary dim
    ours, our_scale = inverse_frequencies(parse_config(raw).rope, head_dim)
    theirs = LlamaRotaryEmbedding(
        LlamaConfig(**{k: v for k, v in raw.items() if k != "architectures"})
    )
    torch.testing.assert_close(ours.float(), theirs.inv_freq.float())
    assert math.isclose(our_scale, theirs.attention_scaling, rel_tol=1e-6)


def test_17_unknown_rope_type_is_refused() -> None:
    from interlock.runners.model.config import ConfigError
    from interlock.runners.model.config_json import parse_config
    from interlock.testing.checks import TINY_LLAMA as TINY

    raw = {
        **TINY,
        "rope_scaling": {"rope_type": "dynamic-ish", "factor": 2.0},
        "rope_parameters": {"rope_type": "default"},
    }
    with pytest.raises(ConfigError, match="rope type='dynamic-ish' is not supported"):
        parse_config(raw)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_21_integer_or_bool_weights_are_refused(tiny_model, dtype) -> None:
    data = load_file(tiny_model / "model.safetensors")
    data["model.norm.weight"] = data["model.norm.weight"].to(dtype)
    save_file(data, tiny_model / "model.safetensors")
    with pytest.raises(ModelError, match=r"tensor model.norm.weight is stored as (I32|BOOL)"):
        generate(tiny_model)


def test_21_nan_weights_are_refused(tiny_model) -> None:
    data = load_file(tiny_model / "model.safetensors")
    data["model.norm.weight"][3] = float("nan")
    save_file(data, tiny_model / "model.safetensors")
    with pytest.raises(ModelError, match="tensor model.norm.weight holds 1 NaN or infinite"):
        generate(tiny_model)


def test_21_weights_that_overflow_the_dtype_asked_for_are_refused(tiny_model) -> None:
    data = load_file(tiny_model / "model.safetensors")
    data["model.norm.weight"][0] = 1e6  # finite in float32, infinite in float16
    save_file(data, tiny_model / "model.safetensors")
    with pytest.raises(ModelError, match="norm.weight holds 1 NaN or infinite value.s. as float16"):
        generate(tiny_model, dtype="float16")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rms_norm_eps": -1}, "rms_norm_eps=-1.0 is not supported"),
        ({"rms_norm_eps": float("nan")}, "rms_norm_eps=nan is not supported"),
        ({"max_position_embeddings": 0}, "max_position_embeddings=0 is not supported"),
        ({"layer_types": ["full_attention"]}, "layer_types='<1 entries>' is not supported"),
        ({"eos_token_id": -1}, "eos_token_id=-1 is not supported"),
        ({"eos_token_id": [1, 10**9]}, "eos_token_id=1000000000 is not supported"),
    ],
)
def test_21_bad_config_values_are_refused(change, message) -> None:
    from interlock.runners.model.config import ConfigError
    from interlock.runners.model.config_json import parse_config
    from interlock.testing.checks import TINY_LLAMA as TINY

    with pytest.raises(ConfigError, match=message):
        parse_config({**TINY, **change})


def test_28_huge_sizes_are_refused_before_allocating(tiny_model, cli) -> None:
    config = json.loads((tiny_model / "config.json").read_text())
    config.update(hidden_size=2**20, vocab_size=10**6, intermediate_size=2**20)
    (tiny_model / "config.json").write_text(json.dumps(config))
    res = cli("run", "--model", tiny_model, "--max-tokens", "1", "--set", "cudagraph=none")
    assert res.code == 4 and "Traceback" not in res.err
    assert "GiB for its weights" in res.err and "hidden_size=1048576" in res.err


@pytest.mark.parametrize("special", ["dev-zero", "fifo"])
def test_32_special_files_are_refused_as_such(tiny_model, special) -> None:
    name = "weights.safetensors"
    if special == "fifo":
        os.mkfifo(tiny_model / name)
        expected = "is a FIFO, not a regular file"
    else:
        (tiny_model / name).symlink_to("/dev/zero")
        expected = "outside the model directory"
    shard(tiny_model, every_tensor(tiny_model, name))
    with pytest.raises(ModelError, match=expected):
        generate(tiny_model)


def test_14_a_huge_architecture_name_is_not_echoed_whole(tiny_model, cli) -> None:
    from interlock.runners.model.config import ConfigError
    from interlock.runners.model.config_json import parse_config
    from interlock.testing.checks import TINY_LLAMA as TINY

    with pytest.raises(ConfigError) as info:
        parse_config({**TINY, "architectures": ["X" * 60_000]})
    assert len(str(info.value)) < 1000 and "(60000 characters)" in str(info.value)
    config = json.loads((tiny_model / "config.json").read_text())
    (tiny_model / "config.json").write_text(json.dumps({**config, "architectures": ["X" * 60_000]}))
    res = cli("explain", "--model", tiny_model, "--platform", "cpu")
    assert res.code == 1 and "is 60000 characters long" in res.err and len(res.err) < 1000
