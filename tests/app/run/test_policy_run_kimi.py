"""The policy end to end on Kimi Linear (KDA + MLA hybrid): `policy explain` derives attention
hybrid from its config (not mla, though its full-attention layers are MLA), `policy run`
runs what the policy decided (breakable graphs, rule breakable-listed) and matches
transformers, and `policy measure` runs on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_oracle import transformers_greedy
from tiny_models import TinyModels

PROMPT = [7, 93, 12, 54, 3, 88, 41, 19, 66, 102, 5, 27, 71, 30]


@pytest.fixture(scope="module")
def tiny_kimi(tiny_models: TinyModels) -> tuple[Path, object]:
    return tiny_models.path("kimi_linear"), tiny_models.hf("kimi_linear")


def test_explain_derives_attention_hybrid_from_the_config(cli, tiny_kimi):
    path, _ = tiny_kimi
    result = cli("explain", "--model", str(path), "--platform", "cpu", "--json")
    assert result.code == 0, result.err
    doc = result.json()
    assert doc["context"]["sources"]["traits.attention"] == (
        "model config (layer_types: 3 of 4 linear)")
    assert doc["decision"]["breakable"] is True
    assert doc["provenance"]["breakable"]["source"] == "breakable-listed"


@pytest.mark.slow  # the load and the capture of every graph size
def test_run_executes_the_policys_decision_and_matches_transformers(cli, tiny_kimi):
    path, hf = tiny_kimi
    result = cli("run", "--model", str(path), "--platform", "cpu", "--prompt-token-ids",
                 ",".join(map(str, PROMPT)), "--max-tokens", "8", "--ignore-eos", "--json")
    assert result.code == 0, result.err
    doc = result.json()
    assert doc["decision"]["breakable"] is True
    assert doc["outputs"][0]["token_ids"] == transformers_greedy(hf, PROMPT, 8)
    graphs = doc["graphs"]
    assert graphs["captured"] and not graphs["fallbacks"]
    assert graphs["break_points"][:4] == [
        "layer 0: linear attention (KDA)", "layer 1: linear attention (KDA)",
        "layer 2: linear attention (KDA)", "layer 3: latent attention"]


@pytest.mark.slow
def test_bench_runs_on_it(cli, tiny_kimi, tmp_path):
    path, _ = tiny_kimi
    result = cli("measure", str(path), "--platform", "cpu", "--vary", "runner=mrv1,mrv2",
                 "--prompt-len", "10", "--max-tokens", "3", "--trials", "2", "--warmup", "0",
                 "--json", "--record", tmp_path / "r.json")
    assert result.code == 0, result.err
    record = result.json()
    cells = {c["decision"]["runner"] for c in record["configurations"]}
    assert cells == {"mrv1", "mrv2"}
    assert not record["skipped"] and record["samples"]
