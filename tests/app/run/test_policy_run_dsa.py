"""The policy end to end on a seed model's architecture (a tiny GlmMoeDsa): `policy explain`
derives attention dsa from its config, `policy run` runs what the policy decided (on the CPU:
mrv2 with breakable graphs, rule breakable-dsa) and matches transformers, and `policy measure`
runs the seed's 2x2 (runner x breakable) on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_oracle import transformers_greedy
from tiny_models import TinyModels

PROMPT = list(range(1, 11))  # longer than the model's index_topk of 4


@pytest.fixture(scope="module")
def tiny_glm(tiny_models: TinyModels) -> tuple[Path, object]:
    return tiny_models.path("glm_moe_dsa"), tiny_models.hf("glm_moe_dsa")


def test_explain_derives_attention_dsa_from_the_config(cli, tiny_glm):
    path, _ = tiny_glm
    result = cli("explain", "--model", str(path), "--platform", "cpu", "--json")
    assert result.code == 0, result.err
    doc = result.json()
    assert doc["context"]["sources"]["traits.attention"] == "model config (index_topk=4)"
    assert doc["decision"]["breakable"] is True
    assert doc["provenance"]["breakable"]["source"] == "breakable-dsa"


@pytest.mark.slow  # ~12 s: the load and the capture of every graph size
def test_run_executes_the_policys_decision_and_matches_transformers(cli, tiny_glm):
    path, hf = tiny_glm
    result = cli("run", "--model", str(path), "--platform", "cpu", "--prompt-token-ids",
                 ",".join(map(str, PROMPT)), "--max-tokens", "8", "--ignore-eos", "--json")
    assert result.code == 0, result.err
    doc = result.json()
    decision = doc["decision"]
    assert (decision["runner"], decision["breakable"]) == ("mrv2", True)
    assert doc["provenance"]["breakable"]["source"] == "breakable-dsa"
    assert doc["outputs"][0]["token_ids"] == transformers_greedy(hf, PROMPT, 8)
    graphs = doc["graphs"]
    assert graphs["captured"] and not graphs["fallbacks"]
    assert graphs["break_points"][0] == "layer 0: DSA index top-4 + sparse attention"


@pytest.mark.slow
def test_bench_runs_the_seeds_two_by_two(cli, tiny_glm, tmp_path):
    path, _ = tiny_glm
    result = cli("measure", str(path), "--platform", "cpu", "--vary", "runner=mrv1,mrv2",
                 "--vary", "breakable=false,true", "--prompt-len", "10", "--max-tokens", "3",
                 "--trials", "2", "--warmup", "0", "--json", "--record", tmp_path / "r.json")
    assert result.code == 0, result.err
    record = result.json()
    assert record["factors"] == {"runner": ["mrv1", "mrv2"], "breakable": [False, True]}
    cells = {(c["decision"]["runner"], c["decision"]["breakable"])
             for c in record["configurations"]}
    assert cells == {("mrv1", False), ("mrv1", True), ("mrv2", False), ("mrv2", True)}
    assert not record["skipped"] and record["samples"]
