"""config.json numbers that were only checked for finiteness, third hostile pass (issue 38):
a multiplying factor of -1e30 is finite and nonsense. Each is refused at load naming the
key, with exit 4 from `policy run`; the values released models use pass."""

from __future__ import annotations

from typing import Any

import pytest
from tiny_models import MLA

from interlock.runners.model.config_json import parse_config
from tests.hostile.test_config_numbers import LLAMA, _refused, _yarn

DEEPSEEK = dict(LLAMA, architectures=["DeepseekV3ForCausalLM"], **MLA, hidden_size=64,
                num_attention_heads=4, first_k_dense_replace=1, n_group=1, topk_group=1)


def _deepseek(**extra: Any) -> dict[str, Any]:
    return {**DEEPSEEK, **extra}


CASES = {
    "routed_scaling_factor -1e30": (_deepseek(routed_scaling_factor=-1e30),
                                    "routed_scaling_factor"),
    "routed_scaling_factor 0": (_deepseek(routed_scaling_factor=0), "routed_scaling_factor"),
    "routed_scaling_factor 1e30": (_deepseek(routed_scaling_factor=1e30),
                                   "routed_scaling_factor"),
    "yarn mscale -1e30": (dict(LLAMA, **_yarn(mscale=-1e30)), "mscale"),
    "yarn mscale 1e30": (dict(LLAMA, **_yarn(mscale=1e30)), "mscale"),
    "yarn mscale_all_dim -1": (dict(LLAMA, **_yarn(mscale_all_dim=-1.0)), "mscale_all_dim"),
    "yarn attention_factor -2": (dict(LLAMA, **_yarn(attention_factor=-2.0)),
                                 "attention_factor"),
    "yarn attention_factor 0": (dict(LLAMA, **_yarn(attention_factor=0)), "attention_factor"),
    "rms_norm_eps 1e30": (dict(LLAMA, rms_norm_eps=1e30), "rms_norm_eps"),
    "initializer_range -1": (dict(LLAMA, initializer_range=-1.0), "initializer_range"),
}


@pytest.mark.parametrize("case", CASES)
def test_config_numbers_out_of_their_sane_range_are_refused(cli, tmp_path, case) -> None:
    config, words = CASES[case]
    _refused(cli, tmp_path, config, words)


def test_the_values_released_models_use_pass() -> None:
    assert parse_config(_deepseek(routed_scaling_factor=2.5)).moe is not None
    rope = parse_config(dict(LLAMA, **_yarn(mscale=0.707, mscale_all_dim=1.0,
                                            attention_factor=1.2))).rope
    assert (rope.mscale, rope.mscale_all_dim, rope.attention_factor) == (0.707, 1.0, 1.2)
    assert parse_config(dict(LLAMA, **_yarn(mscale_all_dim=0))).rope.mscale_all_dim == 0
