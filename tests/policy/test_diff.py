from __future__ import annotations

from checkout import AFTER_51653, BEFORE_51653, BEFORE_53155, SEED_53155, SHIPPED
from policy_texts import with_rules

from interlock.policy import load_policy, load_policy_text
from interlock.policy.diff import OUTCOME, diff_policies, render_text, summarize, to_json
from interlock.policy.domain import Domain

ROCM = ("rocm", "")
BREAKABLE_ENV = "VLLM_USE_BREAKABLE_CUDAGRAPH"
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
#: What vllm#53155 took off breakable graphs on ROCm: vLLM 0.29.0's breakable list less
#: the DeepSeek V3.2 pair its ROCm default already left out.
NO_LONGER_BREAKABLE_ON_ROCM = {
    "DeepseekV4ForCausalLM",
    "DeepSeekV4MTPModel",
    "GlmMoeDsaForCausalLM",
    "KimiLinearForCausalLM",
    "KimiK3ForConditionalGeneration",
    "KimiK3MTPModel",
    "Dots3NoteForCausalLM",
    "Dots3NoteMTPModel",
    "HYV4ForCausalLM",
    "HYV4MTPModel",
    "InklingForCausalLM",
    "InklingForConditionalGeneration",
    "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration",
}


def load(path):
    return load_policy([path], use_cache=False)


def changes_by_group(diff):
    """(field, old, new) -> {(architecture, platform, device_arch, env items)}."""
    out = {}
    for group in diff.groups():
        contexts = {
            (c.architecture, c.platform, c.device_arch, tuple(sorted(c.env.items())))
            for d in group.by_deciders
            for c in d.contexts
        }
        out[(group.field, group.old, group.new)] = contexts
    return out


def envs_without(name, domain):
    return [tuple(state) for state in domain.env_states if not any(k == name for k, _ in state)]


def test_seed_1_is_kimi_k3_to_mrv2_on_rocm_and_deepseek_v4_to_mrv2_elsewhere() -> None:
    """vLLM 0.27.1 -> 0.28.0: #51653 lets Kimi-K3 run MRV2 on ROCm; the same release put
    DeepSeek V4 on the V2 list everywhere but ROCm."""
    diff = diff_policies(load(BEFORE_51653), load(AFTER_51653))
    envs = envs_without(RUNNER_ENV, diff.domain)
    elsewhere = [(p, "") for p in diff.domain.platforms if p != "rocm"]
    assert changes_by_group(diff) == {
        ("runner", "mrv1", "mrv2"): {
            ("KimiK3ForConditionalGeneration", *ROCM, env) for env in envs
        } | {("DeepseekV4ForCausalLM", *place, env) for place in elsewhere for env in envs}
    }
    (group,) = diff.groups()
    kimi = next(d for d in group.by_deciders if d.contexts[0].architecture.startswith("Kimi"))
    assert kimi.old.decider == "rule rocm-excluded-from-mrv2"
    assert kimi.new.decider == "rule v2-allow-list"
    assert summarize(kimi.contexts, diff.domain) == [
        f"on rocm/* for KimiK3ForConditionalGeneration, unless {RUNNER_ENV} is set"
    ]


def test_vllm_0_31_to_0_32_is_exactly_the_rocm_dsa_switch_to_mrv2() -> None:
    """vLLM 0.32 removed ROCM_DEFAULT_MRV1_ARCHITECTURES, and nothing else in the domain moved."""
    history = BEFORE_53155.parent
    diff = diff_policies(load(history / "vllm-0.31.0.yaml"), load(history / "vllm-0.32.0.yaml"))
    keep_runner = envs_without(RUNNER_ENV, diff.domain)
    listed = ("DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM", "GlmMoeDsaForCausalLM")
    assert changes_by_group(diff) == {
        ("runner", "mrv1", "mrv2"): {(arch, *ROCM, env) for arch in listed for env in keep_runner}
    }
    (deciders,) = diff.groups()[0].by_deciders
    assert deciders.old.decider == "rule rocm-dsa-stays-on-mrv1"
    assert deciders.new.decider == "defaults"


def test_vllm_0_31_drops_only_0_30s_gfx950_deepseek_v4_default() -> None:
    """0.30.0 -> 0.31.0 differs only where 0.30.0's rule on the decided runner applied:
    DeepSeek V4 on gfx950 under MRV2 gets its CUDA graphs back."""
    history = BEFORE_53155.parent
    old, new = load(history / "vllm-0.30.0.yaml"), load(history / "vllm-0.31.0.yaml")
    diff = diff_policies(old, new)
    assert {(c.field, c.old.value, c.new.value) for c in diff.changes} == {
        ("cudagraph", "none", "full_and_piecewise")
    }
    contexts = {c.context for c in diff.changes}
    assert {(c.architecture, c.platform, c.device_arch) for c in contexts} == {
        ("DeepseekV4ForCausalLM", "rocm", "gfx950"),
        ("DeepseekV4ForConditionalGeneration", "rocm", "gfx950"),
    }
    # Only where MRV2 runs: the V4 model stays on MRV1 unless the environment says V2.
    assert all(
        c.context.env.get("VLLM_USE_V2_MODEL_RUNNER") == "1"
        for c in diff.changes
        if c.context.architecture == "DeepseekV4ForCausalLM"
    )
    (group,) = diff.groups()
    assert {d.old.decider for d in group.by_deciders} == {
        "rule rocm-gfx950-deepseek-v4-eager-under-mrv2"
    }


def test_seed_2_moves_glm_to_mrv1_and_drops_rocm_breakable() -> None:
    """vLLM 0.29.0 -> the state just after #53155: exactly what that PR changed."""
    diff = diff_policies(load(BEFORE_53155), load(SEED_53155))
    keep_runner = envs_without(RUNNER_ENV, diff.domain)
    keep_breakable = envs_without(BREAKABLE_ENV, diff.domain)
    assert changes_by_group(diff) == {
        ("runner", "mrv2", "mrv1"): {("GlmMoeDsaForCausalLM", *ROCM, env) for env in keep_runner},
        ("breakable", "true", "false"): {
            (arch, *ROCM, env) for arch in NO_LONGER_BREAKABLE_ON_ROCM for env in keep_breakable
        },
        # breakable implies compile: false, so compile follows breakable.
        ("compile", "false", "true"): {
            (arch, *ROCM, env) for arch in NO_LONGER_BREAKABLE_ON_ROCM for env in keep_breakable
        },
    }
    runner = diff.groups()[0]
    assert [(d.old.decider, d.new.decider) for d in runner.by_deciders] == [
        ("defaults", "rule rocm-dsa-stays-on-mrv1")
    ]
    breakable = diff.groups()[1]
    assert {(d.old.decider, d.new.decider) for d in breakable.by_deciders} == {
        ("rule breakable-listed", "rule rocm-no-default-breakable"),
    }


def test_text_report_names_the_change_the_place_and_both_deciders() -> None:
    text = render_text(diff_policies(load(BEFORE_53155), load(SEED_53155)))
    lines = text.splitlines()
    assert lines[0] == "runner: mrv2 → mrv1"
    assert lines[1].startswith("  old: defaults (")
    assert "vllm-0.29.0.yaml:" in lines[1]
    assert lines[2].startswith("  new: rule rocm-dsa-stays-on-mrv1 (")
    assert "2026-09-01-vllm-53155.yaml:" in lines[2]
    assert lines[3] == f"    on rocm/* for GlmMoeDsaForCausalLM, unless {RUNNER_ENV} is set"


def test_a_policy_against_itself_says_no_decision_differs(shipped) -> None:
    diff = diff_policies(shipped, load(SHIPPED))
    assert diff.equal
    contexts = diff.domain.size()
    assert contexts > 0
    assert render_text(diff) == f"no decision differs over {contexts} contexts\n"
    runner_only = diff_policies(shipped, load(SHIPPED), ["runner"])
    assert render_text(runner_only) == (
        f"no decision differs over {contexts} contexts (fields runner)\n"
    )


def test_reordering_independent_rules_is_no_change() -> None:
    a = """\
  - id: dsa-mrv1
    when: {attention: dsa, platform: rocm}
    set: {runner: mrv1}
    reason: DSA models stay on mrv1 on ROCm
  - id: gqa-piecewise
    when: {attention: gqa}
    set: {cudagraph: piecewise}
    reason: GQA models take piecewise graphs here
"""
    first, second = a.split("  - id: gqa-piecewise\n")
    b = "  - id: gqa-piecewise\n" + second + first
    diff = diff_policies(load_policy_text(with_rules(a)), load_policy_text(with_rules(b)))
    assert diff.equal


def test_a_list_rewritten_as_the_equivalent_trait_condition_is_no_change() -> None:
    listed = """\
  - id: dsa-mrv1
    when: {platform: rocm, architecture: [DsaA, DsaB, DsaC]}
    set: {runner: mrv1}
    reason: DSA models stay on mrv1 on ROCm
"""
    trait = listed.replace("architecture: [DsaA, DsaB, DsaC]", "attention: dsa")
    old, new = load_policy_text(with_rules(listed)), load_policy_text(with_rules(trait))
    assert diff_policies(old, new).equal
    # ...while the same rewrite of an incomplete list is a change, exactly for the missing one.
    partial = load_policy_text(with_rules(listed.replace(", DsaC]", "]")))
    diff = diff_policies(partial, new)
    assert {c.context.architecture for c in diff.changes} == {"DsaC"}
    assert {c.context.platform for c in diff.changes} == {"rocm"}


def test_fields_limit_what_is_compared() -> None:
    diff = diff_policies(load(BEFORE_53155), load(SEED_53155), fields=["runner"])
    assert {g.field for g in diff.groups()} == {"runner"}


def test_an_optional_field_set_on_one_side_only() -> None:
    old = load_policy_text(with_rules())
    new = load_policy_text(
        with_rules("""\
  - id: sizes
    when: {attention: dsa}
    set: {capture_sizes: [1, 2, 4]}
    reason: DSA models capture three batch sizes
""")
    )
    (group,) = diff_policies(old, new).groups()
    assert (group.field, group.old, group.new) == ("capture_sizes", "(unset)", "[1, 2, 4]")
    (deciders,) = group.by_deciders
    assert (deciders.old.decider, deciders.new.decider) == ("not set", "rule sizes")


def test_an_env_value_only_one_side_declares_is_an_outcome_change() -> None:
    old = load_policy_text(with_rules())
    new = load_policy_text(
        with_rules().replace('{"0": mrv1, "1": mrv2}', '{"0": mrv1, "1": mrv2, "2": mrv1}')
    )
    diff = diff_policies(old, new)
    (group,) = diff.groups()
    assert group.field == OUTCOME
    assert group.old.startswith("error: USE_V2='2'")
    assert group.new == "resolves"
    assert {tuple(c.context.env.items()) for c in diff.changes} == {(("USE_V2", "2"),)}
    assert "only with USE_V2=2" in render_text(diff)


def test_device_archs_and_features_are_part_of_the_domain() -> None:
    old = load_policy_text(with_rules())
    new = load_policy_text(
        with_rules("""\
  - id: gfx950-tp
    when: {platform: rocm, device_arch: gfx950, features: {tensor_parallel_size: {gt: 1}}}
    set: {cudagraph: piecewise}
    reason: piecewise graphs on gfx950 with tensor parallelism
""")
    )
    diff = diff_policies(old, new)
    places = {(c.context.platform, c.context.device_arch) for c in diff.changes}
    assert places == {("rocm", "gfx950")}
    sizes = {c.context.features["tensor_parallel_size"] for c in diff.changes}
    assert sizes == {2}
    (line,) = summarize([c.context for c in diff.changes], diff.domain)
    assert line == "on rocm/gfx950 for every architecture, with tensor_parallel_size=2"


def test_json_lists_every_context_and_the_domain() -> None:
    old, new = load(BEFORE_53155), load(SEED_53155)
    doc = to_json(diff_policies(old, new), old, new)
    assert doc["equal"] is False
    change = doc["changes"][0]
    assert (change["field"], change["old"], change["new"]) == ("runner", "mrv2", "mrv1")
    (deciders,) = change["deciders"]
    assert deciders["new"]["decider"] == "rule rocm-dsa-stays-on-mrv1"
    assert len(deciders["contexts"]) == change["count"] == 3
    assert doc["domain"]["contexts"] == Domain.of(old, new).size()


# -- the command ----------------------------------------------------------------------------


def git(cwd, *args: str) -> None:
    import subprocess

    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def test_diff_command_exit_codes(capsys) -> None:
    from interlock.cli import main

    assert main(["diff", str(SHIPPED), str(SHIPPED), "--exit-code"]) == 0
    assert capsys.readouterr().out.startswith("no decision differs over ")
    assert main(["diff", str(BEFORE_51653), str(BEFORE_53155)]) == 0
    assert capsys.readouterr().out.startswith("runner: mrv1 → mrv2\n")
    assert main(["diff", str(BEFORE_51653), str(BEFORE_53155), "--exit-code"]) == 1


def test_diff_command_json_and_fields(capsys) -> None:
    import json

    from interlock.cli import main

    assert main(["diff", str(BEFORE_53155), str(SEED_53155), "--json", "--fields", "runner"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fields"] == ["runner"]
    assert [(c["field"], c["old"], c["new"]) for c in doc["changes"]] == [
        ("runner", "mrv2", "mrv1")
    ]
    assert main(["diff", str(SHIPPED), str(SHIPPED), "--fields", "runer"]) == 2
    assert "unknown decision field 'runer'" in capsys.readouterr().err


def test_diff_git_revisions(tmp_path, monkeypatch, capsys) -> None:
    from interlock.cli import main

    git(tmp_path, "init", "-q")
    (tmp_path / "policies.yaml").write_text(BEFORE_51653.read_text())
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "extra.yaml").write_text(AFTER_51653.read_text())
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "before #51653")
    (tmp_path / "policies.yaml").write_text(AFTER_51653.read_text())
    git(tmp_path, "commit", "-qam", "#51653")
    monkeypatch.chdir(tmp_path / "site")

    assert main(["diff", "git:HEAD~1", "git:HEAD", "--exit-code"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("runner: mrv1 → mrv2\n")
    assert "rule rocm-excluded-from-mrv2 (HEAD~1:policies.yaml:" in out
    assert "on rocm/* for KimiK3ForConditionalGeneration" in out
    # git:REV:path names a file relative to the repository root; a working file mixes in.
    assert main(["diff", "git:HEAD:site/extra.yaml", "git:HEAD", "--exit-code"]) == 0
    assert main(["diff", "git:HEAD~1", "extra.yaml", "--exit-code"]) == 1
    capsys.readouterr()
    assert main(["diff", "git:nosuchrev", "git:HEAD"]) == 1
    assert "git:nosuchrev: git show nosuchrev:policies.yaml failed" in capsys.readouterr().err
