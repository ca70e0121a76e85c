"""The `when` language: names and globs, traits (unknown never matches), feature comparisons."""

from __future__ import annotations

import pytest

from interlock.policy import Facts, PolicyError, parse_when
from interlock.policy.conditions import Failure


def facts(**kw) -> Facts:
    base = dict(
        architecture="DeepseekV32ForCausalLM",
        platform="rocm",
        device_arch="gfx950",
        traits={"moe": True, "attention": "dsa"},
        features={"tensor_parallel_size": 8, "speculative": True, "quant": "fp8"},
    )
    base.update(kw)
    return Facts(**base)


@pytest.mark.parametrize(
    ("when", "matches"),
    [
        ({}, True),
        ({"architecture": "DeepseekV32ForCausalLM"}, True),
        ({"architecture": "Deepseek*"}, True),
        ({"architecture": "deepseek*"}, False),  # case-sensitive, as HF names are
        ({"architecture": ["LlamaForCausalLM", "DeepseekV3?ForCausalLM"]}, True),
        ({"architecture": ["LlamaForCausalLM", "Qwen*"]}, False),
        ({"platform": "rocm"}, True),
        ({"platform": ["cuda", "xpu"]}, False),
        ({"device_arch": "gfx9*"}, True),
        ({"device_arch": ["gfx942", "sm_*"]}, False),
        ({"device_arch": "gfx9[45]0"}, True),
        ({"attention": "dsa"}, True),
        ({"attention": ["mla", "dsa"]}, True),
        ({"moe": True}, True),
        ({"moe": False}, False),
        ({"features": {"tensor_parallel_size": {"gt": 1}}}, True),
        ({"features": {"tensor_parallel_size": {"gt": 1, "le": 4}}}, False),
        ({"features": {"tensor_parallel_size": {"ge": 8, "lt": 9}}}, True),
        ({"features": {"tensor_parallel_size": 8}}, True),
        ({"features": {"tensor_parallel_size": [2, 4]}}, False),
        ({"features": {"tensor_parallel_size": {"in": [4, 8]}}}, True),
        ({"features": {"tensor_parallel_size": {"ne": 8}}}, False),
        ({"features": {"speculative": True}}, True),
        ({"features": {"speculative": 1}}, False),  # 1 is not true
        ({"features": {"quant": {"eq": "fp8"}}}, True),
        ({"features": {"quant": {"gt": 1}}}, False),  # not a number: no order
        ({"platform": "rocm", "attention": "dsa", "device_arch": "gfx950"}, True),
    ],
)
def test_matching(when: dict, matches: bool) -> None:
    assert parse_when(when).matches(facts()) is matches


def test_the_first_failure_follows_the_fixed_order() -> None:
    when = parse_when(
        {"attention": "mla", "features": {"tensor_parallel_size": {"gt": 8}}, "platform": "cuda"}
    )
    failure = when.first_failure(facts())
    assert failure == Failure("platform", ["cuda"], "rocm")
    assert failure.describe() == "platform: wanted cuda, observed rocm"
    assert when.first_failure(facts(platform="cuda")) == Failure("attention", ["mla"], "dsa")


def test_unknown_trait_does_not_match_and_says_so() -> None:
    failure = parse_when({"attention": "dsa"}).first_failure(facts(traits={}))
    assert failure is not None and failure.unknown
    assert failure.describe() == "attention: wanted dsa, observed unknown"


def test_missing_feature_does_not_match_and_says_not_given() -> None:
    failure = parse_when({"features": {"lora": True}}).first_failure(facts())
    assert failure is not None and failure.unknown
    assert failure.describe() == "features.lora: wanted = true, observed not given"


def test_wanted_texts() -> None:
    when = parse_when({"features": {"tensor_parallel_size": {"gt": 8, "in": [16, 32]}}})
    text = when.first_failure(facts()).describe()
    assert text == "features.tensor_parallel_size: wanted > 8 and one of [16, 32], observed 8"
    names = [f"Arch{i}" for i in range(10)]
    text = parse_when({"architecture": names}).first_failure(facts()).describe(limit=2)
    assert "wanted one of [Arch0, Arch1, … +8 more]" in text
    assert parse_when({"device_arch": "sm_*"}).first_failure(facts(device_arch="")).observed == ""


def test_to_data_round_trips() -> None:
    data = {
        "architecture": ["A", "B*"],
        "platform": "rocm",
        "attention": "dsa",
        "features": {"tensor_parallel_size": {"gt": 1}},
    }
    assert parse_when(data).to_data() == data
    assert parse_when(parse_when(data).to_data()) == parse_when(data)


@pytest.mark.parametrize(
    ("when", "path", "needle"),
    [
        ({"architecure": "X"}, "architecure", "did you mean 'architecture'"),
        ({"attention": "sparse"}, "attention", "'dsa'"),
        ({"moe": "yes"}, "moe", "valid boolean"),
        ({"features": {"tp": {"gt": "1"}}}, "features.tp.gt", "valid"),
        ({"features": {"tp": {}}}, "features.tp", "at least one of gt"),
        ({"architecture": []}, "architecture", "at least 1 item"),
    ],
)
def test_parse_when_errors_name_the_key(when: dict, path: str, needle: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_when(when)
    assert info.value.path == path
    assert needle in str(info.value)
