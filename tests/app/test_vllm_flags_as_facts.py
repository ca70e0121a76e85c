"""Issue 24 item 1: every vLLM flag that is a policy feature enters the resolution as a given
fact with its source, the emitted flags follow the decision, ``policy vllm`` takes
``--feature``, and ``-O0``..``-O3`` are read as vLLM reads them."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from interlock.vllm.flags import read_user_flags


@pytest.fixture
def glm(tmp_path: Path) -> Path:
    path = tmp_path / "GLM"
    path.mkdir()
    config = {"architectures": ["GlmMoeDsaForCausalLM"], "index_topk": 2048,
              "n_routed_experts": 256}
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_tensor_parallel_flag_reaches_the_site_rule(cli, site, glm, monkeypatch) -> None:
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    res = cli("vllm", "args", "--platform", "rocm", "--device-arch", "gfx950",
              "--policy", f"@shipped{os.pathsep}{site}", "--json", glm,
              "--tensor-parallel-size", "8")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "0"  # mrv1: the site rule decided
    resolution = doc["resolution"]
    assert resolution["provenance"]["runner"]["source"] == "site-mi355x-tp-mrv1"
    context = resolution["context"]
    assert context["features"]["tensor_parallel_size"] == 8
    assert context["sources"]["features.tensor_parallel_size"] == (
        "vllm flag --tensor-parallel-size"
    )
    assert doc["argv"][-2:] == ["--tensor-parallel-size", "8"]
    assert "feature tensor_parallel_size=8 (vllm flag --tensor-parallel-size)" in res.err


def test_feature_flag_on_policy_vllm_is_passed_to_vllm(cli, site, glm) -> None:
    res = cli("vllm", "args", "--platform", "rocm", "--device-arch", "gfx950",
              "--policy", f"@shipped{os.pathsep}{site}", "--feature", "tensor_parallel_size=8",
              glm)
    assert res.code == 0, res.err
    argv = shlex.split(res.out)
    assert argv[0] == "VLLM_USE_V2_MODEL_RUNNER=0"
    assert argv[-2:] == ["--tensor-parallel-size", "8"]  # vLLM runs what was decided
    assert "(given with --feature)" in res.err


def test_a_feature_contradicting_a_flag_is_an_error(cli, glm) -> None:
    res = cli("vllm", "args", "--platform", "cuda", "--feature", "tensor_parallel_size=4",
              glm, "-tp", "8")
    assert res.code == 1
    assert "--feature tensor_parallel_size=4 contradicts the vllm serve flag -tp 8" in res.err


@pytest.mark.parametrize(
    ("args", "features"),
    [
        (["-tp", "2", "-pp", "3", "-dp", "4"],
         {"tensor_parallel_size": 2, "pipeline_parallel_size": 3, "data_parallel_size": 4}),
        (["--max-num-seqs=64", "--quantization", "fp8"],
         {"max_num_seqs": 64, "quantization": "fp8"}),
        (["--enforce-eager"], {"enforce_eager": True}),
        (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
         {"speculative": "mtp"}),
        (["--speculative-config", '{"model": "draft", "num_speculative_tokens": 3}'],
         {"speculative": "draft_model"}),
        (["-O3"], {"optimization_level": 3}),
        (["--optimization-level", "1"], {"optimization_level": 1}),
    ],
)
def test_each_feature_flag_is_read(args, features) -> None:
    user = read_user_flags(args)
    assert user.features == features
    assert all(v.startswith("vllm flag -") for v in user.sources().values())


@pytest.mark.parametrize(("level", "mode"), [("-O0", "none"), ("-O1", "piecewise"),
                                               ("-O2", "full_and_piecewise")])
def test_levels_replace_the_policys_graph_defaults(cli, tmp_path, level, mode) -> None:
    model = tmp_path / "L"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    res = cli("vllm", "args", "--platform", "cuda", "--json", model, level)
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["decision"]["cudagraph"] == mode
    assert doc["decision"]["compile"] is (level != "-O0")
    # interlock adds no -cc flag that disagrees with the level.
    flags = [a for a in doc["argv"] if a.startswith("-cc.cudagraph_mode=")]
    assert flags in ([], [f"-cc.cudagraph_mode={mode.upper()}"])
    if level != "-O2":  # O2 is the shipped defaults already
        assert f"cudagraph given by {level}" in res.err and not flags


def test_a_rule_contradicting_the_level_is_an_error_naming_both(cli, tmp_path) -> None:
    model = tmp_path / "L"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LongcatFlashNgramForCausalLM"]}')
    res = cli("vllm", "args", "--platform", "cuda", model, "-O0")
    assert res.code == 1
    assert "-O0 sets cudagraph=none" in res.err
    assert "rules longcat-ngram-full-graphs-eager-prefill" in res.err
    assert "would pass -cc.cudagraph_mode=FULL" in res.err
    explicit = cli("vllm", "args", "--platform", "cuda", model, "-O0",
                   "-cc.cudagraph_mode=FULL", "-cc.mode=NONE")
    assert explicit.code == 0, explicit.err  # the user's explicit keys beat the level
