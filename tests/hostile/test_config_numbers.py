"""config.json numbers that crashed model construction or ran silently wrong (issue 28: C8,
C9, W1-W3): each is refused at load, naming config.json and the key, with exit 4."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from interlock.runners.model.config import ConfigError
from interlock.runners.model.config_json import parse_config

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 64,
}
MISTRAL = dict(LLAMA, architectures=["MistralForCausalLM"], sliding_window=16)


def _yarn(**params: Any) -> dict[str, Any]:
    return {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, **params}}


def _llama3(**params: Any) -> dict[str, Any]:
    base = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    return {"rope_scaling": {**base, **params}}


def _refused(cli, tmp_path: Path, config: dict[str, Any], words: str) -> None:
    """Refused by parse_config naming ``words``, and by `policy run` with exit 4."""
    with pytest.raises(ConfigError) as caught:
        parse_config(config)
    assert words in str(caught.value), str(caught.value)
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(config))
    res = cli("run", "--model", model, "--prompt-token-ids", "1,2", "--max-tokens", "1", "--json")
    assert res.code == 4, res.err
    message = res.json()["error"]["message"]
    assert "config.json" in message and words in message, message
    assert "Traceback" not in res.err


C8 = {
    "hidden-below-heads": (dict(LLAMA, hidden_size=3), "hidden_size=3"),
    "positions-2^62": (dict(LLAMA, max_position_embeddings=2**62), "max_position_embeddings"),
    "layers-2^31": (dict(LLAMA, num_hidden_layers=2**31), "num_hidden_layers"),
    "window-2^63": (dict(MISTRAL, sliding_window=2**63), "sliding_window"),
    "yarn-original-abc": (dict(LLAMA, **_yarn(original_max_position_embeddings="abc")),
                          "original_max_position_embeddings"),
    "yarn-original-0": (dict(LLAMA, **_yarn(original_max_position_embeddings=0)),
                        "original_max_position_embeddings"),
    "yarn-beta-fast-negative": (dict(LLAMA, **_yarn(beta_fast=-1)), "beta_fast"),
    "llama3-low-freq-0": (dict(LLAMA, **_llama3(low_freq_factor=0)), "low_freq_factor"),
    "llama3-high-equals-low": (dict(LLAMA, **_llama3(high_freq_factor=1.0)),
                               "high_freq_factor"),
}


@pytest.mark.parametrize("case", C8)
def test_c8_config_numbers_that_crashed_are_refused_by_key(cli, tmp_path, case) -> None:
    config, words = C8[case]
    _refused(cli, tmp_path, config, words)


@pytest.mark.parametrize("head_dim", [15, 7])
def test_c9_an_odd_head_dim_is_refused_at_load(cli, tmp_path, head_dim) -> None:
    _refused(cli, tmp_path, dict(LLAMA, head_dim=head_dim), f"head_dim={head_dim}")


def test_c9_an_odd_derived_head_dim_is_named_as_derived(cli, tmp_path) -> None:
    # 36 // 4 = 9
    _refused(cli, tmp_path, dict(LLAMA, hidden_size=36),
             "head_dim (hidden_size // num_attention_heads)=9")


W1 = {
    "theta-0": (dict(LLAMA, rope_theta=0), "rope_theta"),
    "theta-negative": (dict(LLAMA, rope_theta=-10000.0), "rope_theta"),
    "theta-1e300": (dict(LLAMA, rope_theta=1e300), "rope_theta"),
    "linear-factor-0": (dict(LLAMA, rope_scaling={"rope_type": "linear", "factor": 0}),
                        "factor"),
    "linear-factor-1e-300": (
        dict(LLAMA, rope_scaling={"rope_type": "linear", "factor": 1e-300}), "factor"),
    "linear-factor-negative": (
        dict(LLAMA, rope_scaling={"rope_type": "linear", "factor": -2.0}), "factor"),
    "yarn-factor-0": (dict(LLAMA, **_yarn(factor=0)), "factor"),
    "params-theta-0": (dict(LLAMA, rope_parameters={"rope_type": "default", "rope_theta": 0}),
                       "rope_theta"),
}


@pytest.mark.parametrize("case", W1)
def test_w1_rope_theta_and_factor_must_be_positive(cli, tmp_path, case) -> None:
    config, words = W1[case]
    _refused(cli, tmp_path, config, words)


@pytest.mark.parametrize("eps", [1e300, 1e39, -1e-6, 0, 1e-300])
def test_w2_rms_norm_eps_must_be_finite_and_positive_in_float32(cli, tmp_path, eps) -> None:
    _refused(cli, tmp_path, dict(LLAMA, rms_norm_eps=eps), "rms_norm_eps")


@pytest.mark.parametrize("window", [-1, -4096])
def test_w3_a_negative_sliding_window_is_refused(cli, tmp_path, window) -> None:
    _refused(cli, tmp_path, dict(MISTRAL, sliding_window=window), "sliding_window")


def test_the_bounds_let_real_configs_through() -> None:
    assert parse_config(dict(LLAMA, max_position_embeddings=10_485_760)).max_position_embeddings
    assert parse_config(dict(MISTRAL, sliding_window=4096)).sliding_windows == (4096, 4096)
    assert parse_config(dict(LLAMA, rms_norm_eps=1e-5, rope_theta=500000.0)).rope.theta == 5e5
    rope = parse_config(dict(LLAMA, **_llama3())).rope
    assert (rope.low_freq_factor, rope.high_freq_factor) == (1.0, 4.0)
