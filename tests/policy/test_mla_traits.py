"""What the policy derives from DeepSeek V2/V3 configs (as transformers 5.24 writes them):
attention mla, moe and mtp; the catalog agrees for the architectures it lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import DeepseekV2Config, DeepseekV3Config

from interlock.policy.context import traits_from_config


def _written(config) -> dict:
    """The config.json transformers would write for ``config``."""
    return json.loads(config.to_json_string())


@pytest.mark.parametrize(("config", "mtp"), [
    (DeepseekV2Config(), (False, "no num_nextn_predict_layers")),
    (DeepseekV3Config(), (True, "num_nextn_predict_layers=1")),
    (DeepseekV3Config(num_mtp_layers=0), (False, "num_nextn_predict_layers=0")),
])
def test_mla_moe_and_mtp_come_from_the_config_keys(config, mtp):
    traits = traits_from_config(_written(config))
    assert traits["attention"] == ("mla", "kv_lora_rank=512")
    experts = config.n_routed_experts
    assert traits["moe"] == (True, f"n_routed_experts={experts}")
    assert traits["mtp"] == mtp


def test_explain_of_a_model_directory_shows_the_derived_traits(cli, tmp_path: Path):
    # Relabelled so the catalog (which lists DeepseekV3ForCausalLM) does not supply them.
    raw = {**_written(DeepseekV3Config()), "architectures": ["ResearchMlaForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    code, out, err = cli("explain", "--model", str(tmp_path), "--platform", "cpu")
    assert (code, err) == (0, "")
    lines = {line.split()[1]: line for line in out.splitlines()
             if line.strip().startswith("trait ")}
    assert "mla" in lines["attention"] and "model config (kv_lora_rank=512)" in lines["attention"]
    assert "true" in lines["moe"] and "n_routed_experts=256" in lines["moe"]
    assert "true" in lines["mtp"] and "num_nextn_predict_layers=1" in lines["mtp"]


@pytest.mark.parametrize("architecture", ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"])
def test_the_catalog_agrees_with_the_configs(cli, tmp_path: Path, architecture):
    config = DeepseekV2Config() if "V2" in architecture else DeepseekV3Config()
    raw = {**_written(config), "architectures": [architecture]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    code, out, _ = cli("explain", "--model", str(tmp_path), "--platform", "cpu", "--json")
    assert code == 0
    context = json.loads(out)["context"]
    derived = traits_from_config(raw)
    for trait in ("attention", "moe", "mtp"):
        assert context["traits"][trait]["origin"] == "catalog"
        assert context["traits"][trait]["value"] == derived[trait][0]
