"""`policy impact --log FILE OLD NEW`: the recorded deployments a policy edit would change."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from interlock import decision_log
from interlock.policy.context import make_context
from interlock.policy.loader import load_policy
from interlock.policy.resolution import resolve

REPO = Path(__file__).resolve().parents[2]
SHIPPED = str(REPO / "policies.yaml")
#: 20 deployments: (host, architecture, platform, device arch); the first 3 are the Llama
#: deployments on Hopper the site policy below changes.
DEPLOYMENTS = [
    ("h100-a", "LlamaForCausalLM", "cuda", "sm_90"),
    ("h100-b", "LlamaForCausalLM", "cuda", "sm_90"),
    ("h200-a", "LlamaForCausalLM", "cuda", "sm_90a"),
    ("b200-a", "LlamaForCausalLM", "cuda", "sm_100"),
    ("mi355-a", "LlamaForCausalLM", "rocm", "gfx950"),
    ("h100-a", "MistralForCausalLM", "cuda", "sm_90"),
    ("h100-b", "Qwen3ForCausalLM", "cuda", "sm_90"),
    ("h100-c", "Qwen3MoeForCausalLM", "cuda", "sm_90"),
    ("b200-a", "DeepseekV3ForCausalLM", "cuda", "sm_100"),
    ("b200-b", "GlmMoeDsaForCausalLM", "cuda", "sm_100"),
    ("mi355-a", "GlmMoeDsaForCausalLM", "rocm", "gfx950"),
    ("mi355-b", "KimiK3ForConditionalGeneration", "rocm", "gfx950"),
    ("h200-b", "KimiK3ForConditionalGeneration", "cuda", "sm_90a"),
    ("h200-c", "LongcatFlashNgramForCausalLM", "cuda", "sm_90a"),
    ("mi300-a", "DeepseekV41ForCausalLM", "rocm", "gfx942"),
    ("h100-d", "DeepseekV41ForCausalLM", "cuda", "sm_90"),
    ("a100-a", "MixtralForCausalLM", "cuda", "sm_80"),
    ("a100-b", "Qwen2MoeForCausalLM", "cuda", "sm_80"),
    ("l40-a", "GraniteMoeForCausalLM", "cuda", "sm_89"),
    ("xpu-a", "Qwen2ForCausalLM", "xpu", "pvc"),
]
SITE = """\
schema_version: 1
version: "site-1"
rules:
  - id: site-llama-hopper-piecewise
    when: {architecture: LlamaForCausalLM, device_arch: [sm_90, sm_90a]}
    set: {cudagraph: piecewise}
    reason: our Hopper Llama fleet keeps piecewise graphs until the FULL capture bug is fixed
"""


def write_log(path: Path) -> None:
    policy = load_policy([SHIPPED])
    for host, arch, platform, device_arch in DEPLOYMENTS:
        context = make_context(arch, platform=platform, device_arch=device_arch)
        record = decision_log.build_record(resolve(policy, context), "policy resolve",
                                           model=f"/models/{arch}")
        record["host"] = host
        decision_log.append_record(path, record)
    # The same deployment recorded twice is one deployment.
    decision_log.append_record(path, {**record, "id": "0" * 32})


def test_exactly_the_changed_deployments_are_listed(cli: Any, tmp_path: Path) -> None:
    log = tmp_path / "fleet.jsonl"
    write_log(log)
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    stack = f"{SHIPPED}{os.pathsep}{site}"
    result = cli("impact", "--log", str(log), SHIPPED, stack, "--json")
    assert result.code == 0, result.err
    document = result.json()
    assert document["deployments"] == 20
    changed = document["changed"]
    assert [(c["host"], c["architecture"], c["device_arch"]) for c in changed] == [
        (h, a, d) for h, a, _, d in DEPLOYMENTS[:3]
    ]
    for change in changed:
        (field,) = change["fields"]
        assert (field["field"], field["old"], field["new"]) == (
            "cudagraph", "full_and_piecewise", "piecewise")
        line = load_policy([SHIPPED]).defaults["cudagraph"].location.line
        assert field["old_rule"] == f"defaults ({SHIPPED}:{line})"
        assert field["new_rule"].startswith("rules site-llama-hopper-piecewise (")
        assert change["model"] == "/models/LlamaForCausalLM" and change["platform"] == "cuda"
    text = cli("impact", "--log", str(log), SHIPPED, stack, "--fail-on-change")
    assert text.code == 1
    assert text.out.count("cudagraph: full_and_piecewise -> piecewise") == 3
    assert "3 of 20 recorded deployment(s) would change (21 record(s)" in text.out
    same = cli("impact", "--log", str(log), SHIPPED, "@shipped", "--fail-on-change")
    assert same.code == 0 and same.out.startswith("0 of 20")


def test_a_context_the_new_policy_refuses_is_a_change(cli: Any, tmp_path: Path) -> None:
    log = tmp_path / "fleet.jsonl"
    write_log(log)
    bad = tmp_path / "bad.yaml"
    bad.write_text(SITE.replace("set: {cudagraph: piecewise}", "set: {runner: mrv9}"))
    result = cli("impact", "--log", str(log), SHIPPED, f"{SHIPPED}{os.pathsep}{bad}", "--json")
    assert result.code == 0, result.err
    assert len(result.json()["changed"]) == 3
    assert {f["field"] for c in result.json()["changed"] for f in c["fields"]} >= {"runner"}


def test_a_damaged_log_line_is_named_and_skipped(cli: Any, tmp_path: Path) -> None:
    log = tmp_path / "fleet.jsonl"
    write_log(log)
    with log.open("ab") as f:
        f.write(b"not json\n")
    result = cli("impact", "--log", str(log), SHIPPED, SHIPPED)
    assert result.code == 0 and f"{log}:22: not JSON" in result.err
    assert cli("impact", "--log", str(tmp_path / "none.jsonl"), SHIPPED, SHIPPED).code == 1


#: The seed-2 fix as a site rule: GLM-5.2 stays on MRV1 on gfx950.
SEED2_SITE = """\
schema_version: 1
version: "site-seed2"
rules:
  - id: glm-5.2-stays-on-mrv1
    when: {architecture: GlmMoeDsaForCausalLM, platform: rocm, device_arch: gfx950}
    set: {runner: mrv1}
    reason: MRV2 regresses GLM-5.2's batch-1 TPOT 30-37 % on MI355X (vLLM 53155)
"""


def test_the_upgrade_to_034_names_what_changes_and_what_becomes_refused(
    cli: Any, tmp_path: Path
) -> None:
    """A fleet whose vLLM plugin decided under 0.33.0, asked about 0.34.0: the site rule
    keeping GLM-5.2 on MRV1 becomes a refusal in vLLM's words, HY-V4 on ROCm takes breakable
    graphs, and CI fails."""
    from interlock.vllm.stage import ReleaseStage

    site = tmp_path / "site.yaml"
    site.write_text(SEED2_SITE)
    stack = f"{SHIPPED}{os.pathsep}{site}"
    policy = load_policy([stack])
    log = tmp_path / "fleet.jsonl"
    for host, arch, platform, arch_name in (
        ("mi355-a", "GlmMoeDsaForCausalLM", "rocm", "gfx950"),
        ("mi300-a", "HYV4ForCausalLM", "rocm", "gfx942"),
        ("h100-a", "LlamaForCausalLM", "cuda", "sm_90"),
    ):
        context = make_context(arch, platform=platform, device_arch=arch_name,
                               engine={"vllm": "0.33.0"}, features={"has_triton": True})
        resolution = resolve(policy, context, engine=ReleaseStage("0.33.0"))
        record = decision_log.build_record(
            resolution, "vllm plugin", model=f"/models/{arch}", capabilities=False,
            runner={"name": resolution.decision.runner, "plugin": None,
                    "distribution": "vllm", "version": "0.33.0"})
        record["host"] = host
        decision_log.append_record(log, record)
    same = cli("impact", "--log", str(log), stack, stack, "--fail-on-change")
    assert same.code == 0 and same.out.startswith("0 of 3"), same.out + same.err
    result = cli("impact", "--log", str(log), stack, stack, "--vllm", "0.34.0", "--json")
    assert result.code == 0, result.err
    changed = {c["host"]: {f["field"]: f for f in c["fields"]} for c in result.json()["changed"]}
    assert set(changed) == {"mi355-a", "mi300-a"}
    outcome = changed["mi355-a"]["outcome"]
    assert outcome["old"] == "decided"
    assert outcome["new"].startswith(
        "refused: refused by vLLM 0.34.0 (vllm/platforms/interface.py:1483): "
        "VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported")
    assert "runner=mrv1 from glm-5.2-stays-on-mrv1 (rules)" in outcome["new"]
    assert (changed["mi300-a"]["breakable"]["old"], changed["mi300-a"]["breakable"]["new"]) == (
        False, True)
    gate = cli("impact", "--log", str(log), stack, stack, "--vllm", "0.34.0",
               "--fail-on-change")
    assert gate.code == 1 and "2 of 3 recorded deployment(s) would change" in gate.out
    unread = cli("impact", "--log", str(log), stack, stack, "--vllm", "0.35.0")
    assert unread.code == 5 and "vLLM 0.35.0 is a release interlock has not read" in unread.err
