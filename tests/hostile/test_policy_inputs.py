"""Items 3, 10, 14, 15, 16, 19, 20, 24, 26, 27, 29, 31 and 33 of the hostile-inputs issue:
policies, command-line values and the checks on them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from interlock.core import suggest
from interlock.plugins import KernelSpec, hookimpl

from .conftest import POLICY


def test_03_diff_git_rev_cannot_become_an_option(cli, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q"], check=True)
    target = tmp_path / "written"
    for spec in (f"git:--output={target}", "git:-p", "git:HEAD\nx"):
        res = cli("diff", spec, "policies.yaml")
        assert res.code == 1 and "is not a revision" in res.err
    assert not target.exists()
    for spec in ("git:HEAD:/etc/passwd", "git:HEAD:../x.yaml"):
        res = cli("diff", spec, "policies.yaml")
        assert res.code == 1 and "must be relative to the repository root" in res.err


def test_10_huge_yaml_integer_is_a_located_error(cli, tmp_path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.replace("{gt: 1}", "{gt: " + "9" * 5000 + "}"))
    res = cli("check", "--policy", policy)
    assert res.code == 1 and "Traceback" not in res.err
    assert (
        "p.yaml:11:66: error: invalid: rules[0].when.features.tensor_parallel_size.gt: "
        "cannot read value" in res.out
    )
    assert "value has 5000 digits" in res.out and "9" * 100 not in res.out


def test_14_absurd_names_are_refused_and_suggestions_are_bounded(cli, monkeypatch) -> None:
    res = cli("explain", "A" * 120_000, "--platform", "cuda")
    assert res.code == 1 and "is 120000 characters long" in res.err and len(res.err) < 400
    calls = []
    real = suggest.edit_distance
    monkeypatch.setattr(suggest, "edit_distance", lambda a, b: calls.append(1) or real(a, b))
    catalog = [f"Arch{i:05d}ForCausalLM" for i in range(57_000)]
    assert suggest.did_you_mean("Arch00042ForCausalLN", catalog) == "Arch00042ForCausalLM"
    assert len(calls) <= 2 * suggest.MAX_CANDIDATES + 2
    assert suggest.did_you_mean("x" * 60_000, catalog) is None


def test_15_policy_fifo_is_refused_not_waited_on(cli, tmp_path) -> None:
    fifo = tmp_path / "policy.fifo"
    os.mkfifo(fifo)
    res = cli("explain", "X", "--platform", "cuda", "--policy", fifo)
    assert res.code == 1 and "is a FIFO, not a regular file" in res.err


def test_16_absurd_capture_sizes_are_refused(cli) -> None:
    for text in ("1e20", "0", "-4", "1,2,99999999"):
        res = cli("explain", "X", "--platform", "cuda", "--set", f"capture_sizes={text}")
        assert res.code == 1 and "from 1 to 65536" in res.err


def test_16_capture_sizes_are_capped_to_what_the_run_can_use(cli) -> None:
    sizes = ",".join(str(i) for i in range(1, 2049))
    res = cli(
        "run",
        "--model",
        "demo",
        "--prompt-token-ids",
        "5,6",
        "--max-tokens",
        "2",
        "--set",
        f"capture_sizes={sizes}",
        "--set",
        "cudagraph=full",
        "--json",
        "--verbose",
        "--debug-graphs",
    )
    assert res.code == 0, res.err
    doc = res.json()
    (note,) = [s for s in doc["trace"] if s["stage"] == "run"]
    assert note["sets"]["capture_sizes"] == [1, 2]
    assert "2046 of the 2048 capture sizes could never be used" in note["reason"]


def _broken_kernels() -> object:
    class Kernels:
        @hookimpl
        def interlock_kernel_specs(self) -> list[KernelSpec]:
            return [
                KernelSpec(
                    op="silu_and_mul",
                    backend="broken",
                    target="nowhere_at_all:f",
                    platforms=("cpu",),
                    dtypes=("float32",),
                    plugin_api=">=1.0",
                )
            ]

    return Kernels()


def test_19_strict_mode_stops_a_run_at_a_broken_plugin_kernel(
    cli, register_plugin, monkeypatch
) -> None:
    # The full user-side suite is tests/plugins/test_plugin_kernels_installed.py.
    register_plugin(_broken_kernels(), "brokenk")
    monkeypatch.setenv("INTERLOCK_PLUGINS_STRICT", "1")
    res = cli("run", "--model", "demo", "--max-tokens", "1", "--set", "cudagraph=none")
    assert res.code == 3 and "Traceback" not in res.err
    assert "kernel silu_and_mul/broken (brokenk)" in res.err


@pytest.mark.parametrize(
    "feature, message",
    [
        ("pipeline_parallel_size=nan", "'nan' is not a finite number"),
        ("pipeline_parallel_size=0x10", "pipeline_parallel_size takes an integer"),
        ("has_triton=maybe", "has_triton takes true or false"),
        ("tensor_parallel_size=inf", "'inf' is not a finite number"),
    ],
)
def test_20_feature_values_are_typed(cli, feature, message) -> None:
    res = cli("explain", "LlamaForCausalLM", "--platform", "cuda", "--feature", feature)
    assert res.code == 1 and message in res.err


def test_20_nan_threshold_and_temperature_are_refused(cli, tmp_path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.replace("{gt: 1}", "{gt: .nan}"))
    res = cli("check", "--policy", policy)
    assert res.code == 1 and "NaN is not allowed in a policy" in res.out
    res = cli("run", "--model", "demo", "--temperature", "nan")
    assert res.code == 1 and "temperature=nan is invalid" in res.err


BROKEN_DEFAULT = POLICY.replace("runner: mrv2, cudagraph", "runner: cpuonly, cudagraph")


def test_24_check_reports_an_unservable_default_and_a_fallback_loop(
    cli, register_plugin, tmp_path
) -> None:
    from interlock.plugins import PlatformSupport, RunnerSpec

    def spec(name: str, fallback: str | None) -> RunnerSpec:
        return RunnerSpec(
            name=name,
            description="test",
            plugin_api=">=1.0,<2",
            platforms={"cpu": PlatformSupport(cudagraph={"none"})},
            factory="x:Y",
            fallback=fallback,
        )

    class Loop:
        @hookimpl
        def interlock_runner_specs(self) -> list[RunnerSpec]:
            return [spec("cpuonly", "loopy"), spec("loopy", "cpuonly")]

    register_plugin(Loop(), "loop")
    policy = tmp_path / "p.yaml"
    policy.write_text(BROKEN_DEFAULT)
    res = cli("check", "--policy", policy)
    assert res.code == 1
    assert (
        "error: fallback-loop: defaults.runner cpuonly: its fallback chain loops: "
        "cpuonly -> loopy -> cpuonly" in res.out
    )
    assert "warning: default-runner-unserved: defaults.runner cpuonly (fallbacks: cpuonly -> " \
        "loopy) serves no runner on cuda, rocm, xpu" in res.out
    res = cli("table", "--policy", policy)
    assert res.code == 1 and "Traceback" not in res.err
    assert "error:" in res.out and "DsaModel" in res.out and "cpu " in res.out


CATALOG5 = """\
schema_version: 1
version: "n1"
catalog:
  GlmMoeDsaForCausalLM: {moe: true, attention: dsa}
  DeepseekV32ForCausalLM: {moe: true, attention: dsa}
  DeepseekV4ForCausalLM: {moe: true, attention: dsa}
  LlamaForCausalLM: {moe: false, attention: gqa}
  QwenForCausalLM: {moe: false, attention: gqa}
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
rules:
  - id: rocm-dsa
    when: {platform: rocm, architecture: [DeepseekV32ForCausalLM, DeepseekV4ForCausalLM]}
    set: {runner: mrv1}
    reason: DSA models regress on MRV2 on ROCm
    ref: https://github.com/vllm-project/vllm/pull/53155
"""


def test_26_near_miss_in_a_small_catalog_is_found(cli, tmp_path) -> None:
    policy = tmp_path / "site.yaml"
    policy.write_text(CATALOG5)
    res = cli("check", "--policy", policy, "--strict")
    assert res.code == 1
    assert (
        "near-miss-list: rule rocm-dsa lists 2 architectures that all have attention: dsa, "
        "but misses 1 more catalog architecture(s) with attention: dsa: "
        "GlmMoeDsaForCausalLM" in res.out
    )


def test_26_a_trait_nearly_every_architecture_has_is_no_near_miss(cli, tmp_path) -> None:
    dense = "".join(f"  Dense{i}ForCausalLM: {{moe: false}}\n" for i in range(9))
    text = (
        CATALOG5.split("catalog:\n")[0] + "catalog:\n" + dense + "  MoeForCausalLM: "
        "{moe: true}\n" + CATALOG5.split("QwenForCausalLM: {moe: false, attention: gqa}\n")[1]
    )
    names = ", ".join(f"Dense{i}ForCausalLM" for i in range(8))
    text = text.replace("[DeepseekV32ForCausalLM, DeepseekV4ForCausalLM]", f"[{names}]")
    policy = tmp_path / "dense.yaml"
    policy.write_text(text)
    res = cli("check", "--policy", policy, "--strict")
    assert "near-miss-list" not in res.out, res.out


@pytest.mark.parametrize("key", ["Llama/ForCausalLM", "Llama ForCausalLM", "Llamaé"])
def test_27_quoted_key_failing_its_pattern_says_so(cli, tmp_path, key) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.replace("  DenseModel:", f'  "{key}":'))
    res = cli("check", "--policy", policy)
    assert res.code == 1
    assert f"key {key!r}: string should match pattern" in res.out
    assert "quote it" not in res.out


@pytest.mark.parametrize(
    "content, where, message",
    [
        (b"schema_version: 1\n# caf\xe9 au lait\n", "p.yaml:2:6:", "not UTF-8 (byte 0xe9)"),
        (
            b'schema_version: 1\nversion: "a\x00b"\n',
            "p.yaml:2:12:",
            "control character '\\x00' is not allowed",
        ),
        (
            b"schema_version: 1\nrules:\n\t- id: a\n",
            "p.yaml:3:1:",
            "(a tab: YAML indents with spaces only)",
        ),
        (
            b"schema_version: 1\ncatalog:\n  " + b"A" * 1100 + b": {moe: true}\n",
            "p.yaml:3:",
            "(a key longer than 1024 characters: YAML does not allow one)",
        ),
    ],
)
def test_29_encoding_and_yaml_errors_say_where_and_what(
    cli, tmp_path, content, where, message
) -> None:
    (tmp_path / "p.yaml").write_bytes(content)
    res = cli("check", "--policy", tmp_path / "p.yaml")
    assert res.code == 1 and "Traceback" not in res.err
    (line,) = [x for x in res.out.splitlines() if "error" in x]
    assert line.endswith(message) or message in line
    assert where in line


def test_31_empty_policy_path_and_empty_env_list_are_errors(cli, monkeypatch) -> None:
    res = cli("explain", "X", "--platform", "cuda", "--policy", "")
    assert res.code == 1 and "an empty path names no policy file" in res.err
    monkeypatch.setenv("INTERLOCK_POLICY", ":::")
    res = cli("explain", "X", "--platform", "cuda")
    assert res.code == 1 and "INTERLOCK_POLICY=':::' names no policy file" in res.err


def test_33_bad_capture_sizes_echo_the_users_text(cli) -> None:
    res = cli("explain", "X", "--platform", "cuda", "--set", "capture_sizes=-4")
    assert "bad value '-4'" in res.err and "(-4,)" not in res.err


def test_34_a_directory_where_a_cache_entry_belongs_is_replaced(policy_file: Path) -> None:
    from interlock.core import disk_cache
    from interlock.policy import load_policy

    load_policy([policy_file])
    (entry,) = disk_cache.cache_dir().glob("policy-*.entry")
    entry.unlink()
    entry.mkdir()
    (entry / "junk").write_text("x")
    load_policy([policy_file])
    assert entry.is_file() and entry.read_bytes().startswith(b"interlock-cache 1 ")
