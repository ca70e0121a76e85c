"""Issue 43 item 1: `policy bench` marks the policy's pick in the table, the record and the
plot; a measured alternative that beats it significantly is reported with the rule that
decided the pick and the evidence entry of a rule that changes it; --fail-if-pick-loses
makes that exit 1."""

from __future__ import annotations

import json
from pathlib import Path

from interlock.bench.stats import MIN_TRIALS
from interlock.policy.lint import lint_paths

ARGS = ("--load-format", "dummy", "--vary", "runner=fast,slow", "--prompt-len", "4",
        "--max-tokens", "3", "--warmup", "0", "--trials", str(MIN_TRIALS))
# A site's rule choosing a runner on this machine: "slow" is 30 ms per step slower than "fast".
SITE = """\
schema_version: 1
version: site-1
rules:
  - id: cpu-runner
    when: {{platform: cpu}}
    set: {{runner: {runner}}}
    reason: the runner this site measured best on its CPU hosts
    ref: https://example.invalid/site/bench
"""


def _site(folder: Path, runner: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "site.yaml"
    path.write_text(SITE.format(runner=runner))
    return path


def _pick_row(out: str) -> str:
    (row,) = [line for line in out.splitlines() if "← policy's pick" in line]
    return row


def test_a_pick_that_loses_is_reported_with_its_rule_and_evidence(
    cli, shared_tiny_model, tmp_path
) -> None:
    site = _site(tmp_path / "site", "slow")
    plot, record_path = tmp_path / "pick.svg", tmp_path / "evidence" / "pick.json"
    argv = ("bench", shared_tiny_model, *ARGS, "--policy", "@shipped", "--policy", site,
            "--plot", plot, "--record", record_path)
    res = cli(*argv, "--fail-if-pick-loses")
    assert res.code == 1, res.err
    assert "--fail-if-pick-loses fails it" in res.err and "Traceback" not in res.err
    assert _pick_row(res.out).split()[:2] == ["c1", "slow"]
    assert "policy's pick: c1 (runner=slow), slower than c0 (runner=fast) by " in res.out
    assert "significant, the measurement contradicts the policy" in res.out
    assert "the policy's pick c1 loses to c0 at batch size(s) 1" in res.out
    assert f"decided by: runner=slow by rule cpu-runner ({site}:6)" in res.out
    assert f"(relative to {site}, as `policy check` reads it)" in res.out
    assert "    when: {platform: cpu, architecture: LlamaForCausalLM}" in res.out
    assert "    set: {runner: fast}" in res.out
    assert "    evidence: [../evidence/pick.json]" in res.out
    record = json.loads(record_path.read_text())
    assert record["pick"] == {
        "config": "c1", "decision": {"runner": "slow"},
        "decided_by": {"runner": {"by": "rule cpu-runner", "file": str(site), "line": 6}},
    }
    compared = record["analysis"]["batch_sizes"]["1"]["pick"]
    assert compared["config"] == "c1" and compared["alternative"] == "c0"
    assert compared["beaten"] is True and compared["margin"]["low"] > 0
    assert compared["margin"]["significant"] is True
    svg = plot.read_text()
    assert "c1: runner=slow  ← policy's pick (beaten, batch 1)" in svg
    # The printed entry is one `policy check` accepts: the record's context matches the
    # rule's `when`, and the record does not contradict the value it sets.
    fixed = (SITE.format(runner="fast").replace("when: {platform: cpu}",
             "when: {platform: cpu, architecture: LlamaForCausalLM}")
             + "    evidence: [../evidence/pick.json]\n")
    site.write_text(fixed)
    findings = lint_paths(["@shipped", site], runners=["mrv1", "mrv2", "fast", "slow"])
    codes = {f.code for f in findings}
    assert not codes & {"evidence-invalid", "evidence-contradicts"}, findings
    # Without the option the same finding is reported and the command succeeds.
    site.write_text(SITE.format(runner="slow"))
    assert cli(*argv).code == 0


def test_a_pick_that_wins_is_marked_and_passes_the_gate(cli, shared_tiny_model, tmp_path) -> None:
    site = _site(tmp_path, "fast")
    res = cli("bench", shared_tiny_model, *ARGS, "--policy", "@shipped", "--policy", site,
              "--record", tmp_path / "r.json", "--fail-if-pick-loses")
    assert res.code == 0, res.err
    assert _pick_row(res.out).split()[:2] == ["c0", "fast"]
    assert "policy's pick: c0 (runner=fast); the fastest alternative c1 (runner=slow) " \
        "differs by -" in res.out
    assert "loses to" not in res.out
    compared = json.loads((tmp_path / "r.json").read_text())["analysis"]["batch_sizes"]["1"]
    assert compared["pick"]["beaten"] is False and compared["pick"]["margin"]["high"] < 0
