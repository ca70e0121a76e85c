"""Issue 42: a refusal is an outcome every command reports, naming the rule, with exit 5;
the model's task is a fact `policy vllm` reads from `--runner` and `LLM` sees too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from interlock.core.errors import EXIT_CODES, error_kind
from interlock.policy import PolicyRefused

REFUSED = 5
SITE_REFUSES_LLAMA = (
    'schema_version: 1\nversion: "site"\nrules:\n'
    "  - {id: site-no-llama, when: {architecture: LlamaForCausalLM},"
    " refuse: Llama is not served here, reason: the site says so}\n"
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("INTERLOCK_POLICY", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH",
                 "INTERLOCK_DECISION_LOG"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def _model(tmp_path: Path, arch: str, **config: Any) -> Path:
    path = tmp_path / arch
    path.mkdir()
    body = {"architectures": [arch], "num_attention_heads": 8, "num_key_value_heads": 2, **config}
    (path / "config.json").write_text(json.dumps(body))
    return path


def test_the_exit_code_is_documented() -> None:
    assert EXIT_CODES["refused"] == REFUSED
    security = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert "| 5 | refused: a rule of the policy refuses the context" in security


def test_vllm_args_refuses_step5_on_mrv1_naming_the_rule(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tmp_path, "Step5ForCausalLM")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    res = cli("vllm", "args", "--platform", "cuda", "--device-arch", "sm_90",
              "--engine-version", "vllm=0.33.0", model)
    assert res.code == REFUSED and res.out == ""
    assert "refused by rule step5-refuses-mrv1 (policies.yaml:" in res.err
    assert "Model Runner V1 does not support: Step5" in res.err
    assert "[runner=mrv1 from VLLM_USE_V2_MODEL_RUNNER (env)]" in res.err
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    ok = cli("vllm", "args", "--platform", "cuda", "--device-arch", "sm_90", model)
    assert ok.code == 0 and "VLLM_USE_V2_MODEL_RUNNER=1" in ok.out


def test_vllm_runner_flag_gives_the_task(cli: Any, tmp_path: Path) -> None:
    model = _model(tmp_path, "LlamaForCausalLM")
    res = cli("vllm", "args", "--platform", "cuda", "--device-arch", "sm_90", "--json", model,
              "--runner", "pooling")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["resolution"]["task"] == "pooling"
    assert doc["resolution"]["context"]["traits"]["task"]["origin"] == "given"
    assert doc["resolution"]["provenance"]["cudagraph"]["source"] == "pooling-piecewise-graphs"
    assert "-cc.cudagraph_mode=PIECEWISE" in doc["argv"] and doc["adjustments"] == []
    bad = cli("vllm", "args", "--platform", "cuda", model, "--runner", "chat")
    assert bad.code == 1 and "--runner chat: vLLM's model tasks are auto" in bad.err


def test_an_encoder_decoder_config_decodes_with_full_graphs(cli: Any, tmp_path: Path) -> None:
    model = _model(tmp_path, "T5ForConditionalGeneration", is_encoder_decoder=True)
    res = cli("explain", "--model", model, "--platform", "cuda", "--device-arch", "sm_90")
    assert res.code == 0, res.err
    assert "trait task          encoder-decoder" in res.out
    assert "rules encoder-decoder-full-decode-only" in res.out


def test_resolve_prints_the_refused_document_and_exits_5(cli: Any) -> None:
    res = cli("resolve", "Step5ForConditionalGeneration", "--platform", "rocm",
              "--env", "VLLM_USE_V2_MODEL_RUNNER=0")
    assert res.code == REFUSED
    doc = res.json()
    assert doc["refusal"]["rule"] == "step5-refuses-mrv1"
    assert doc["decision"]["runner"] == "mrv1"
    assert [s["name"] for s in doc["trace"] if s["stage"] == "refusal"] == ["step5-refuses-mrv1"]


def test_table_shows_refused_cells_and_is_not_an_error(cli: Any) -> None:
    res = cli("table", "--architecture", "Step5*", "--platform", "cuda",
              "--env", "VLLM_USE_V2_MODEL_RUNNER=0")
    assert res.code == 0, res.err
    assert res.out.count("refused by step5-refuses-mrv1 (policies.yaml:") == 2
    rows = cli("table", "--architecture", "Step5ForCausalLM", "--platform", "cuda",
               "--env", "VLLM_USE_V2_MODEL_RUNNER=0", "--format", "json").json()
    assert rows[0]["refusal"]["message"] == "Model Runner V1 does not support: Step5"


def test_diff_reports_a_context_that_becomes_refused(cli: Any, write: Any) -> None:
    site = write("site.yaml", SITE_REFUSES_LLAMA)
    res = cli("diff", "@shipped", f"@shipped:{site}")
    assert res.code in (0, 1), res.err
    assert "outcome: resolves → refused by rule site-no-llama: Llama is not served here" in (
        res.out
    )
    assert "new: a rule of the policy refuses the context" in res.out


def test_the_llm_api_raises_the_refusal(tiny_models: Any, write: Any) -> None:
    from interlock.llm import LLM

    site = write("site.yaml", SITE_REFUSES_LLAMA)
    with pytest.raises(PolicyRefused) as info:
        LLM(str(tiny_models.path("llama")), policy=["@shipped", str(site)], num_blocks=16,
            max_model_len=32, max_num_seqs=2, max_num_batched_tokens=16)  # fmt: skip
    assert error_kind(info.value) == "refused"
    assert str(info.value).startswith("refused by rule site-no-llama (")


def test_the_fleet_table_shows_refused_cells(cli: Any, write: Any) -> None:
    res = cli("table", "--architecture", "Step5*", "--target", "cuda:sm_90",
              "--env", "VLLM_USE_V2_MODEL_RUNNER=0")
    assert res.code == 0, res.err
    assert res.out.count("refused by step5-refuses-mrv1") == 2
    site = write("site.yaml", SITE_REFUSES_LLAMA)
    changed = cli("table", "--policy", f"@shipped:{site}", "--architecture", "LlamaForCausalLM",
                  "--target", "cuda:sm_90", "--format", "json").json()
    cell = changed["rows"][0]["cells"]["cuda:sm_90"]
    assert cell["refusal"]["rule"] == "site-no-llama" and cell["changed"] == ["outcome"]
