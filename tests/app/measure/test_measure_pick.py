"""Issue 43 item 1: `policy measure` marks the policy's pick in the table, the record and the
plot; a measured alternative that beats it significantly is reported with the rule that
decided the pick and the evidence entry of a rule that changes it; --fail-if-pick-loses
makes that exit 1."""

from __future__ import annotations

import json
from pathlib import Path

from interlock.measure.stats import MIN_TRIALS
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
    argv = ("measure", shared_tiny_model, *ARGS, "--policy", "@shipped", "--policy", site,
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
    res = cli("measure", shared_tiny_model, *ARGS, "--policy", "@shipped", "--policy", site,
              "--record", tmp_path / "r.json", "--fail-if-pick-loses")
    assert res.code == 0, res.err
    assert _pick_row(res.out).split()[:2] == ["c0", "fast"]
    assert "policy's pick: c0 (runner=fast); the fastest alternative c1 (runner=slow) " \
        "differs by -" in res.out
    assert "loses to" not in res.out
    compared = json.loads((tmp_path / "r.json").read_text())["analysis"]["batch_sizes"]["1"]
    assert compared["pick"]["beaten"] is False and compared["pick"]["margin"]["high"] < 0


def _samples(tpot: dict[str, list[float]], batch_size: int = 1) -> list[dict[str, object]]:
    return [
        {"config": cid, "batch_size": batch_size, "block": block, "warmup": False,
         "tpot_ms": value, "ttft_ms": value, "throughput_tok_s": 1000 / value}
        for cid, values in tpot.items() for block, value in enumerate(values)
    ]


def test_the_pick_is_compared_on_the_benchs_own_test() -> None:
    from interlock.measure.analysis import analyse

    noise = [0.0, 0.3, -0.2, 0.1, -0.1]
    tpot = {"c0": [10 + n for n in noise], "c1": [40 + n for n in noise],
            "c2": [25 + n for n in noise]}
    factors = {"runner": ["a", "b", "c"]}
    entry = analyse(_samples(tpot), list(tpot), factors, [1], complete=True, seed=0,
                    pick="c1")["batch_sizes"]["1"]
    # Both others beat it significantly: the fastest of them is named.
    assert entry["pick"]["alternative"] == "c0" and entry["pick"]["beaten"] is True
    assert entry["pick"]["margin"]["value"] == 30.0
    winner = analyse(_samples(tpot), list(tpot), factors, [1], complete=True, seed=0,
                     pick="c0")["batch_sizes"]["1"]["pick"]
    assert winner["alternative"] == "c2" and winner["beaten"] is False
    assert winner["margin"]["high"] < 0
    # From fewer than MIN_TRIALS trials no claim is made, however large the gap.
    few = {cid: values[: MIN_TRIALS - 1] for cid, values in tpot.items()}
    entry = analyse(_samples(few), list(few), factors, [1], complete=True, seed=0,
                    pick="c1")["batch_sizes"]["1"]
    assert entry["pick"]["beaten"] is False and entry["pick"]["margin"]["low"] > 0


def test_each_alternative_that_beats_the_pick_gets_its_entry(tmp_path: Path) -> None:
    from interlock.measure.render import contradiction_text

    def compared(alternative: str) -> dict[str, object]:
        return {"config": "c1", "alternative": alternative, "metric": "tpot_ms",
                "margin": {"value": 3.0, "low": 2.0, "high": 4.0, "significant": True},
                "beaten": True}

    record = {
        "context": {"architecture": "X", "platform": "cpu", "device_arch": ""},
        "pick": {"config": "c1", "decision": {"runner": "b", "breakable": False},
                 "decided_by": {"runner": {"by": "override", "file": None, "line": None},
                                "breakable": {"by": "defaults", "file": None, "line": None}}},
        "configurations": [
            {"id": "c0", "levels": {"runner": "a", "breakable": False}},
            {"id": "c1", "levels": {"runner": "b", "breakable": False}},
            {"id": "c2", "levels": {"runner": "b", "breakable": True}},
        ],
        "analysis": {"batch_sizes": {"1": {"pick": compared("c0")},
                                     "8": {"pick": compared("c2")}}},
    }
    text = contradiction_text(record, tmp_path / "r.json", kept=False)
    assert "the policy's pick c1 loses to c0 at batch size(s) 1\n" in text
    assert "  decided by: runner=b by override\n" in text
    assert "    set: {runner: a}\n" in text
    assert "the policy's pick c1 loses to c2 at batch size(s) 8\n" in text
    assert "  decided by: breakable=false by defaults\n" in text
    assert "    set: {breakable: true}\n" in text
    # No policy file decided it: the record's path as written; kept under the cache: said.
    assert "(as written):\n    when: {platform: cpu, architecture: X}" in text
    assert f"    evidence: [{tmp_path / 'r.json'}]" in text
    assert "measure with --record evidence/NAME.json" in text
    record["analysis"]["batch_sizes"]["1"]["pick"]["beaten"] = False
    record["analysis"]["batch_sizes"]["8"]["pick"]["beaten"] = False
    assert contradiction_text(record, tmp_path / "r.json", kept=True) == ""
