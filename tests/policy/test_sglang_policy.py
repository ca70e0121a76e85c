"""An SGLang policy: SGLang's decision fields chosen by the ``sglang-`` version prefix, the
shipped one (``@sglang``) against SGLang 0.5.23's snapshot, and the tools on it."""

from __future__ import annotations

import json

import pytest
from checkout import REPO

from interlock.core.decision import SGLANG, SglangDecision
from interlock.core.errors import PolicyError
from interlock.policy import load_policy, make_context, resolve
from interlock.policy.loader import load_policy_text
from interlock.policy.snapshot import conformance, load_snapshot

pytestmark = pytest.mark.usefixtures("isolated_env")

SNAPSHOT = REPO / "conformance" / "sglang-0.5.23.jsonl"
SHIPPED_SGLANG = REPO / "examples" / "sglang.yaml"
GLM_ROCM = ("GlmMoeDsaForCausalLM", "--platform", "rocm", "--device-arch", "gfx950")
SGLANG_BASE = """\
schema_version: 1
version: "sglang-0.5.23"
defaults: {decode_cuda_graph: full, prefill_cuda_graph: disabled, torch_compile: false,
           attention_backend: triton}
"""


def _line_of(text: str) -> int:
    """The line of the shipped SGLang policy that holds ``text``."""
    lines = SHIPPED_SGLANG.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


def test_the_version_prefix_chooses_sglangs_fields() -> None:
    policy = load_policy(["@sglang"])
    assert policy.engine == "sglang" and policy.vocabulary is SGLANG
    res = resolve(policy, make_context("GlmMoeDsaForCausalLM", platform="rocm",
                                       device_arch="gfx950"))
    assert isinstance(res.decision, SglangDecision)
    assert res.decision.to_dict() == {
        "decode_cuda_graph": "full", "prefill_cuda_graph": "disabled", "torch_compile": False,
        "attention_backend": "dsa", "decode_cuda_graph_max_bs": 512,
        "prefill_cuda_graph_max_bs": 8192,
    }


def test_explain_engine_sglang_names_the_line_of_each_field(cli) -> None:
    code, out, err = cli("explain", "--engine", "sglang", *GLM_ROCM)
    assert (code, err) == (0, "")
    assert "policy sglang-0.5.23" in out and "for SGLang 0.5.23" in out
    backend = next(line for line in out.splitlines()
                   if line.strip().startswith("attention_backend"))
    rule = "rocm-attention-backend-dsa-prefill-max-bs-8192"
    assert "dsa" in backend and rule in backend
    # The rule's `set:` line, where the value is written.
    assert f"examples/sglang.yaml:{_line_of('id: ' + rule) + 2}" in backend
    assert "runner" not in out.split("context")[0]  # SGLang has no runner axis


def test_resolve_json_carries_sglangs_decision_and_release(cli) -> None:
    code, out, _ = cli("resolve", "--engine", "sglang", "LlamaForCausalLM", "--platform", "cuda",
                       "--device-arch", "sm_90", "--set", "prefill_cuda_graph=disabled")
    doc = json.loads(out)
    assert code == 0
    assert doc["decision"]["prefill_cuda_graph"] == "disabled"
    assert doc["provenance"]["prefill_cuda_graph"]["stage"] == "overrides"
    assert doc["decision"]["attention_backend"] == "fa3"
    assert doc["releases"][0]["engine"] == "sglang"


def test_a_vllm_field_in_an_sglang_policy_is_named(cli, write) -> None:
    path = write("p.yaml", SGLANG_BASE + "rules:\n  - {id: r, set: {runner: mrv2}, reason: x}\n")
    code, _, err = cli("explain", "X", "--platform", "cpu", "--policy", path)
    assert code != 0
    assert "unknown field 'runner'" in err and "attention_backend" in err
    assert "p.yaml:6" in err


def test_a_vllm_override_of_an_sglang_policy_is_refused(cli) -> None:
    code, _, err = cli("explain", "--engine", "sglang", "X", "--platform", "cpu", "--set",
                       "cudagraph=full")
    assert code != 0 and "unknown decision field 'cudagraph'" in err


def test_engine_flag_refuses_a_policy_for_another_engine(cli) -> None:
    code, _, err = cli("explain", "--engine", "sglang", "X", "--platform", "cpu",
                       "--policy", "@shipped")
    assert code != 0
    assert "decides for vLLM, not sglang" in err and "--policy @sglang" in err


def test_one_policy_decides_for_one_engine(write) -> None:
    site = write("site.yaml", "schema_version: 1\nversion: vllm-0.34.0\n")
    with pytest.raises(PolicyError, match="decides for vllm but .* for sglang"):
        load_policy([str(SHIPPED_SGLANG), str(site)])


def test_a_site_layer_decides_in_the_engine_of_the_files_below(write) -> None:
    site = write("site.yaml", """\
schema_version: 1
version: site-2026.12
rules:
  - id: site-glm-triton
    when: {architecture: GlmMoeDsaForCausalLM}
    set: {attention_backend: triton, prefill_cuda_graph: breakable}
    reason: our GLM-5.2 fleet
""")
    policy = load_policy(["@sglang", str(site)])
    res = resolve(policy, make_context("GlmMoeDsaForCausalLM", platform="rocm",
                                       device_arch="gfx950"))
    assert res.decision.to_dict()["attention_backend"] == "triton"
    assert res.provenance["prefill_cuda_graph"].source == "site-glm-triton"


def test_the_shipped_sglang_policy_conforms_to_sglang_0_5_23() -> None:
    snapshot = load_snapshot(SNAPSHOT)
    assert snapshot.engine == "sglang" and snapshot.engine_version == "0.5.23"
    report = conformance(load_policy(["@sglang"]), snapshot)
    assert report.ok and report.agreement == 1.0
    assert report.disagreements == [] and report.stale_deviations == []
    refused = [r for r in snapshot.rows if r.refusal is not None]
    errors = [r for r in snapshot.rows if r.probe_error is not None]
    # Probe errors reported, never compared; refusals compared as refusals.
    assert report.not_probed == len(errors) > 0
    assert report.compared == len(snapshot.rows) - len(errors) == report.agree
    assert refused and report.sizes_not_compared == 0


def test_conformance_catches_a_changed_decision(cli, write) -> None:
    text = SHIPPED_SGLANG.read_text().replace(
        "set: {prefill_cuda_graph: breakable, attention_backend: fa3,",
        "set: {prefill_cuda_graph: full, attention_backend: fa3,",
    )
    path = write("changed.yaml", text)
    code, out, _ = cli("conformance", str(SNAPSHOT), "--policy", path)
    assert code == 1
    assert "prefill_cuda_graph policy full vs SGLang breakable; cuda-sm-90-defaults" in out


def test_conformance_defaults_to_the_snapshots_engines_policy(cli) -> None:
    code, out, _ = cli("conformance", str(SNAPSHOT))
    assert code == 0
    assert "SGLang 0.5.23, 545 contexts" in out and "agreement  100.0 %" in out
    assert "not probed       22 contexts" in out


def test_a_vllm_snapshot_is_not_compared_with_an_sglang_policy(cli) -> None:
    code, _, err = cli("conformance", str(REPO / "conformance" / "vllm-0.34.0.jsonl"),
                       "--policy", "@sglang")
    assert code != 0 and "decides for SGLang" in err


def test_an_sglang_policy_survives_the_disk_cache() -> None:
    cold = load_policy(["@sglang"])
    warm = load_policy(["@sglang"])
    assert warm.engine == cold.engine == "sglang"
    assert warm.defaults == cold.defaults and warm.rules == cold.rules


def test_sglang_values_are_checked() -> None:
    with pytest.raises(PolicyError, match="decode_cuda_graph"):
        load_policy_text(SGLANG_BASE.replace("decode_cuda_graph: full",
                                             "decode_cuda_graph: piecewise"))
    with pytest.raises(ValueError, match="decode_cuda_graph_max_bs"):
        SglangDecision(decode_cuda_graph_max_bs=0)


# -- the other tools on an SGLang policy ----------------------------------------------------

SITE = """\
schema_version: 1
version: site-2026.12
rules:
  - id: site-glm-triton
    when: {architecture: GlmMoeDsaForCausalLM, platform: rocm}
    set: {attention_backend: triton}
    reason: our GLM-5.2 fleet
"""


def test_check_finds_no_error_in_the_shipped_sglang_policy(cli) -> None:
    code, out, err = cli("check", "--policy", "@sglang")
    assert code == 0 and "0 error(s)" in out + err and ": error:" not in out


def test_every_sglang_rule_cites_sglangs_source_and_names_a_registered_architecture(
    cli, write
) -> None:
    code, out, _ = cli("check", "--policy", "@sglang", "--json")
    codes = [finding["code"] for finding in json.loads(out)["findings"]]
    assert code == 0
    assert codes.count("missing-ref") == codes.count("unknown-architecture") == 0
    # The catalog is SGLang's list of names, so a typo in a site layer is caught and named.
    site = write("site.yaml", SITE.replace("GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLm"))
    code, out, _ = cli("check", "--policy", f"@sglang:{site}", "--json")
    (finding,) = [f for f in json.loads(out)["findings"] if f["code"] == "unknown-architecture"]
    assert "did you mean 'GlmMoeDsaForCausalLM'?" in finding["message"]


def test_diff_names_the_sglang_field_a_site_layer_changes(cli, write) -> None:
    site = write("site.yaml", SITE)
    code, out, _ = cli("diff", "@sglang", f"@sglang:{site}")
    assert code == 0
    assert out.startswith("attention_backend: dsa → triton\n")
    assert "new: rule site-glm-triton" in out and "rocm/gfx950" in out


def test_diff_refuses_policies_of_two_engines(cli) -> None:
    code, _, err = cli("diff", "@shipped", "@sglang")
    assert code != 0 and "decides for vLLM and the new one for SGLang" in err


def test_table_shows_sglangs_columns(cli) -> None:
    code, out, _ = cli("table", "--policy", "@sglang", "--architecture", "GlmMoeDsaForCausalLM",
                       "--platform", "rocm", "--device-arch", "gfx950")
    header, row = out.splitlines()
    assert code == 0
    assert header.split() == ["architecture", "platform", *SGLANG.names]
    assert row.split()[2:] == ["full", "disabled", "false", "dsa", "512", "8192"]


def test_the_sglang_tests_file_passes(cli) -> None:
    code, out, _ = cli("test", str(REPO / "examples" / "sglang.tests.yaml"))
    assert code == 0 and "6 passed, 0 failed" in out


def test_a_case_or_invariant_naming_a_vllm_field_fails_on_an_sglang_policy(cli, write) -> None:
    write("p.yaml", SGLANG_BASE)
    case = write("p.tests.yaml", """\
schema_version: 1
policy: [p.yaml]
cases:
  - name: c
    given: {architecture: X, platform: cpu, outside_catalog: true}
    expect: {runner: mrv1}
""")
    code, out, _ = cli("test", case)
    assert code == 1 and "runner: not a decision field of a SGLang policy" in out
    invariant = write("q.tests.yaml", """\
schema_version: 1
policy: [p.yaml]
invariants:
  - name: i
    expect: {compile: false}
""")
    code, _, err = cli("test", invariant)
    assert code != 0 and "compile is not a decision field of a SGLang policy" in err


def test_a_decision_record_of_an_sglang_policy_is_written_read_and_replayed(
    cli, write, tmp_path
) -> None:
    log = tmp_path / "decisions.jsonl"
    code, _, _ = cli("explain", "--engine", "sglang", *GLM_ROCM, "--decision-log", log)
    assert code == 0
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["policy"]["engine"] == "sglang" and record["runner"] is None
    assert record["decision"]["attention_backend"] == "dsa"
    code, out, _ = cli("log", log)
    assert code == 0 and "attention_backend=dsa" in out
    site = write("site.yaml", SITE)
    code, out, _ = cli("impact", "--log", log, "@sglang", f"@sglang:{site}")
    assert code == 0 and "attention_backend: dsa -> triton" in out
