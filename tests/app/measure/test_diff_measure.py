"""`policy diff OLD NEW --measure`: the changed decision for the model is measured side by
side, and --max-regression turns a significant slowdown into a failing exit status."""

from __future__ import annotations

from pathlib import Path

POLICY = """\
schema_version: 1
version: "{version}"
catalog:
  LlamaForCausalLM: {{family: llama, attention: gqa, moe: false}}
  GlmMoeDsaForCausalLM: {{family: glm, attention: dsa, moe: true}}
defaults: {{runner: fast, cudagraph: none, breakable: false, compile: false}}
rules:
  - id: llama-runner
    when: {when}
    set: {{runner: {runner}}}
    reason: which runner this site gives its Llama models
    ref: https://example.invalid/site
  - id: rocm-dsa-runner
    when: {{platform: rocm, attention: dsa}}
    set: {{runner: {dsa_runner}}}
    reason: a change on hardware this machine does not have
    ref: https://example.invalid/site
"""

WORKLOAD = ("--load-format", "dummy", "--prompt-len", "4", "--max-tokens", "4",
            "--trials", "5", "--warmup", "0")  # 5: MIN_TRIALS, the fewest that claim significance


def write(tmp_path: Path, name: str, when: str = "{architecture: LlamaForCausalLM}",
          runner: str = "fast", dsa_runner: str = "fast") -> Path:
    path = tmp_path / name
    path.write_text(POLICY.format(version=name, when=when, runner=runner, dsa_runner=dsa_runner))
    return path


def test_a_switch_to_the_slow_runner_fails_the_gate(cli, shared_tiny_model, tmp_path):
    old = write(tmp_path, "old.yaml")
    new = write(tmp_path, "new.yaml", runner="slow", dsa_runner="slow")
    result = cli("diff", old, new, "--measure", "--model", shared_tiny_model,
                 "--max-regression", "5", *WORKLOAD)
    assert result.code == 1, result.err
    assert "runner: fast → slow" in result.out
    assert "old: runner=fast" in result.out and "new: runner=slow" in result.out
    assert "a regression beyond 5 %" in result.out
    assert "unmeasured: " in result.out and "on rocm: this machine is cpu" in result.out
    document = cli("diff", old, new, "--measure", "--model", shared_tiny_model, "--json",
                   *WORKLOAD).json()
    [entry] = document["measure"]["measured"]
    # +30 ms on a step of a few ms: far beyond 5 %, however busy the machine.
    assert entry["delta_ms"]["low"] > 0 and entry["delta_pct"] > 20
    assert document["measure"]["regressions"] == []  # no --max-regression: report only
    assert Path(document["measure"]["record"]).is_file()


def test_an_equivalent_rewrite_passes_the_gate(cli, shared_tiny_model, tmp_path):
    old = write(tmp_path, "old.yaml")
    new = write(tmp_path, "new.yaml", when="{family: llama}")
    result = cli("diff", old, new, "--measure", "--model", shared_tiny_model,
                 "--max-regression", "5", *WORKLOAD)
    assert result.code == 0, result.err
    assert "old and new decide alike here (runner=fast" in result.out
    assert "unmeasured" not in result.out


def test_measure_needs_a_model(cli, tmp_path):
    old = write(tmp_path, "old.yaml")
    result = cli("diff", old, old, "--measure")
    assert result.code == 1 and "--measure needs --model" in result.err
    result = cli("diff", old, old, "--max-regression", "5")
    assert result.code == 1 and "only apply with --measure" in result.err
