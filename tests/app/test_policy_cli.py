"""The CLI: exit codes, messages on stderr, text and JSON output, flags."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from interlock.core.terminal import use_color

pytestmark = pytest.mark.usefixtures("isolated_env")

GLM = ("GlmMoeDsaForCausalLM", "--platform", "rocm", "--gfx", "gfx950")


def test_explain_text_names_the_setter_of_each_field(cli) -> None:
    code, out, err = cli("explain", *GLM)
    assert (code, err) == (0, "")
    assert out.startswith("GlmMoeDsaForCausalLM on rocm gfx950\n")
    breakable = next(line for line in out.splitlines() if line.strip().startswith("breakable"))
    assert "false" in breakable and "rocm-no-default-breakable" in breakable
    assert "policies.yaml:" in breakable
    assert "https://github.com/vllm-project/vllm/pull/53155" in out
    assert "- breakable-listed" in out and "observed GlmMoeDsaForCausalLM" in out
    assert "(overridden: breakable by rocm-no-default-breakable (rules))" in out
    assert "\033[" not in out  # NO_COLOR is set by the fixture; capsys is no terminal anyway


def test_gfx_is_an_alias_of_device_arch(cli) -> None:
    _, a, _ = cli("resolve", "X", "--platform", "rocm", "--gfx", "gfx942")
    _, b, _ = cli("resolve", "X", "--platform", "rocm", "--device-arch", "gfx942")
    assert json.loads(a)["context"]["device_arch"] == "gfx942"
    assert a == b


def test_resolve_and_explain_json_are_the_same_document(cli) -> None:
    _, resolved, _ = cli("resolve", *GLM)
    _, explained, _ = cli("explain", *GLM, "--json")
    assert resolved == explained
    doc = json.loads(resolved)
    assert set(doc) >= {"decision", "provenance", "trace", "policy"}
    assert doc["decision"]["runner"] == "mrv2" and doc["decision"]["breakable"] is False
    assert doc["provenance"]["breakable"]["source"] == "rocm-no-default-breakable"
    assert doc["provenance"]["breakable"]["file"] == "policies.yaml"
    assert doc["policy"]["version"] == "vllm-0.33.0..0.34.0"
    assert doc["policy"]["schema_version"] == 1
    assert len(doc["policy"]["revision"]) == 16 and doc["policy"]["files"] == ["policies.yaml"]
    rules = [s for s in doc["trace"] if s["stage"] == "rules"]
    assert [s["name"] for s in rules] == [
        "breakable-dsa",
        "breakable-listed",
        "rocm-no-default-breakable",
        "rocm-deepseek-v41-breakable",
        "longcat-ngram-full-graphs-eager-prefill",
        "pooling-piecewise-graphs",
        "encoder-decoder-full-decode-only",
        "vllm-without-triton-v1",
        "vllm-cpu-no-cuda-graphs",
        "step5-refuses-mrv1",
        "v2-without-triton-refused",
        "breakable-listed-0.34",
        "rocm-not-breakable-0.34",
        "musespark-1x-not-breakable-0.34",
        "cuda-qwen35-breakable",
        "rocm-hyv4-breakable",
        "before-0.34-breakable",
        "before-0.34-not-breakable",
        "before-0.34-rocm-hyv4",
        "rocm-encoder-decoder-eager",
        "breakable-text-model-from-0.34",
        "rocm-text-model-not-breakable-from-0.34",
        "cuda-qwen35-text-model-from-0.34",
    ]
    assert rules[1]["failure"]["condition"] == "architecture"
    assert rules[9]["refuse"] == "Model Runner V1 does not support: Step5"
    assert rules[10]["refuse"] == "Model Runner V2 requires Triton."


def test_env_flags_and_process_environment(cli, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    _, out, _ = cli("resolve", *GLM)
    prov = json.loads(out)["provenance"]["runner"]
    assert (prov["value"], prov["source"], prov["reason"]) == (
        "mrv2",
        "VLLM_USE_V2_MODEL_RUNNER",
        "VLLM_USE_V2_MODEL_RUNNER=1 (process environment)",
    )
    _, out, _ = cli("resolve", *GLM, "--env", "VLLM_USE_V2_MODEL_RUNNER=0")
    prov = json.loads(out)["provenance"]["runner"]
    assert prov["value"] == "mrv1" and "given with --env" in prov["reason"]


def test_set_and_features(cli) -> None:
    _, out, _ = cli(
        "resolve",
        "LlamaForCausalLM",
        "--platform",
        "cuda",
        "--set",
        "cudagraph=piecewise",
        "--set",
        "capture_sizes=1,2,4",
        "--feature",
        "max_model_len=4096",
        "--feature",
        "flag=true",
        "--feature",
        "ratio=0.5",
        "--feature",
        "note=hi",
    )
    doc = json.loads(out)
    assert doc["decision"]["cudagraph"] == "piecewise"
    assert doc["decision"]["capture_sizes"] == [1, 2, 4]
    assert doc["provenance"]["cudagraph"]["stage"] == "overrides"
    features = doc["context"]["features"]
    assert features["max_model_len"] == 4096 and features["flag"] is True
    assert features["ratio"] == 0.5 and features["note"] == "hi"


def test_model_flag(cli, tmp_path) -> None:
    config = {"architectures": ["NewDsaForCausalLM"], "index_topk": 64, "num_experts": 8}
    (tmp_path / "config.json").write_text(json.dumps(config))
    _, out, _ = cli("explain", "--model", str(tmp_path), "--platform", "cuda")
    assert out.startswith("NewDsaForCausalLM on cuda")
    assert "model config (index_topk=64)" in out
    # The trait read from config.json is what the DSA rule tests.
    breakable = next(line for line in out.splitlines() if line.strip().startswith("breakable"))
    assert "true" in breakable and "breakable-dsa" in breakable


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["explain", "X", "--platform", "cuda", "--env", "VLLM_USE_V2_MODEL_RUNNER=2"],
            "policies.yaml:102:3: env.VLLM_USE_V2_MODEL_RUNNER: VLLM_USE_V2_MODEL_RUNNER='2'",
        ),
        (
            ["explain", "X", "--platform", "cuda", "--env", "VLLM_USE_V2=1"],
            "the policy binds no such variable",
        ),
        (["explain", "X", "--platform", "cuda", "--set", "runnr=mrv1"], "did you mean 'runner'"),
        (["explain", "X", "--platform", "cuda", "--set", "cudagraph=fast"], "allowed: none,"),
        (["explain", "--platform", "cuda"], "an architecture is required"),
        (
            ["explain", "X", "--platform", "cuda", "--policy", "/nonexistent.yaml"],
            "/nonexistent.yaml: cannot read policy file",
        ),
    ],
)
def test_input_errors_exit_1(cli, argv: list[str], needle: str) -> None:
    code, out, err = cli(*argv)
    assert code == 1 and out == ""
    assert err.startswith("policy: error: ") and needle in err


def test_policy_file_errors_carry_file_line(cli, write, base) -> None:
    path = write("bad.yaml", base.replace("breakable: false", "breakable: maybe"))
    code, _, err = cli("explain", "X", "--platform", "cuda", "--policy", str(path))
    assert code == 1
    assert f"{path}:6:" in err and "defaults.breakable" in err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["explain", "X", "--feature", "novalue"],
        ["explain", "X", "--bogus"],
        ["table", "--format", "xml"],
    ],
)
def test_usage_errors_exit_2(cli, argv: list[str]) -> None:
    code, _, err = cli(*argv)
    assert code == 2 and "usage:" in err


def test_help_exits_0(cli) -> None:
    code, out, _ = cli("explain", "--help")
    assert code == 0 and "--gfx" in out and "--model" in out


def test_layered_policies_from_flags(cli, write, base) -> None:
    site = write(
        "site.yaml",
        'schema_version: 1\nversion: "s1"\nrules:\n'
        "  - {id: site, when: {architecture: DenseModel}, set: {runner: mrv1}, reason: site}\n",
    )
    _, out, _ = cli(
        "resolve",
        "DenseModel",
        "--platform",
        "cuda",
        "--policy",
        str(write("base.yaml", base)),
        "--policy",
        str(site),
    )
    doc = json.loads(out)
    assert doc["decision"]["runner"] == "mrv1"
    assert doc["provenance"]["runner"]["file"] == str(site)
    assert doc["policy"]["version"] == "t1+s1"


def test_table_formats(cli) -> None:
    code, out, _ = cli("table", "--platform", "rocm", "--platform", "cuda")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "architecture",
        "platform",
        "runner",
        "cudagraph",
        "breakable",
        "compile",
        "capture_sizes",
    ]
    glm = [line.split() for line in lines if line.startswith("GlmMoeDsaForCausalLM ")]
    assert glm == [
        ["GlmMoeDsaForCausalLM", "rocm", "mrv2", "full_and_piecewise", "false", "true", "-"],
        ["GlmMoeDsaForCausalLM", "cuda", "mrv2", "full_and_piecewise", "true", "false", "-"],
    ]
    _, out, _ = cli("table", "--format", "csv", "--platform", "rocm")
    assert "KimiK3ForConditionalGeneration,rocm,mrv2,full_and_piecewise,false,true," in out
    _, out, _ = cli("table", "--format", "json", "--env", "VLLM_USE_V2_MODEL_RUNNER=0")
    rows = json.loads(out)
    assert {r["platform"] for r in rows} == {"cuda", "rocm", "xpu", "cpu"}
    assert all(r["runner"] == "mrv1" for r in rows)
    assert rows[0]["set_by"]["runner"] == "VLLM_USE_V2_MODEL_RUNNER"


def test_table_ignores_the_process_environment(cli, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    _, out, _ = cli("table", "--format", "json", "--platform", "cuda")
    assert {r["runner"] for r in json.loads(out)} == {"mrv2"}


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_without_no_color(monkeypatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_color(FakeTty()) is True
    assert use_color(io.StringIO()) is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert use_color(FakeTty()) is False
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")  # item 34 of the hostile-inputs issue
    assert use_color(FakeTty()) is False


def test_colour_text(monkeypatch, cli) -> None:
    from interlock.core import terminal

    monkeypatch.setattr(terminal, "use_color", lambda stream: True)
    _, out, _ = cli("explain", *GLM)
    assert "\033[1m" in out and "\033[0m" in out


REPO = Path(__file__).resolve().parents[2]


def test_console_script_piped_is_plain_and_exit_codes(tmp_path) -> None:
    script = shutil.which("policy", path=str(Path(sys.executable).parent))
    assert script is not None
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["INTERLOCK_CACHE_DIR"] = str(tmp_path)
    ok = subprocess.run([script, "explain", *GLM], capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "\033[" not in ok.stdout
    assert "rocm-no-default-breakable" in ok.stdout
    bad = subprocess.run(
        [script, "explain", "X", "--platform", "cuda", "--set", "x=1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 1 and "unknown decision field 'x'" in bad.stderr
    usage = subprocess.run([script, "explain", "--nope"], capture_output=True, text=True, env=env)
    assert usage.returncode == 2


def test_importing_policy_and_its_cli_does_not_import_torch() -> None:
    # Every command module, `policy run` included: commands import torch only when they run.
    code = (
        "import importlib, pkgutil, sys, interlock.commands\n"
        "import interlock.cli, interlock.policy.resolution, interlock.policy.loader\n"
        "import interlock.policy.explain\n"
        "for m in pkgutil.iter_modules(interlock.commands.__path__):\n"
        "    importlib.import_module('interlock.commands.' + m.name)\n"
        "assert 'interlock.commands.run' in sys.modules\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'pydantic' not in sys.modules and 'yaml' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_unknown_architecture_is_explained_not_refused(cli) -> None:
    code, out, _ = cli("explain", "GlmMoeDSAForCausalLM", "--platform", "rocm")
    assert code == 0
    assert "not in the catalog: its traits are unknown" in out
    assert "did you mean 'GlmMoeDsaForCausalLM'?" in out
    assert "attention: wanted dsa, observed unknown" in out


def test_diff_of_policies_that_decide_alike_says_so(cli, tmp_path: Path) -> None:
    """Issue 43 item 3: not silence, a line saying over how many contexts nothing differs."""
    from interlock.policy import load_policy
    from interlock.policy.domain import Domain

    # A reordered copy of the shipped policy decides alike: a real no-op edit.
    site = tmp_path / "noop.yaml"
    site.write_text(
        "schema_version: 1\nversion: noop\nrules:\n"
        "  - id: rocm-glm-mrv2\n"
        "    when: {platform: rocm, architecture: GlmMoeDsaForCausalLM,"
        " features: {has_triton: true}}\n"
        "    set: {runner: mrv2}\n"
        "    reason: GLM-5.2 runs MRV2 on ROCm with Triton, as the defaults already say\n"
    )
    stack = f"@shipped{os.pathsep}{site}"
    contexts = Domain.of(load_policy(), load_policy([Path("@shipped"), site])).size()
    res = cli("diff", "@shipped", stack)
    assert (res.code, res.err) == (0, "")
    assert res.out == f"no decision differs over {contexts} contexts\n"
    assert cli("diff", "@shipped", stack, "--exit-code").code == 0
    doc = cli("diff", "@shipped", stack, "--json").json()  # JSON stays one document
    assert doc["equal"] is True and doc["changes"] == []


def test_a_renamed_command_is_refused_with_its_new_name(capsys) -> None:
    from interlock.cli import main

    assert main(["bench", "demo", "--vary", "runner=mrv1,mrv2"]) == 2
    err = capsys.readouterr().err
    assert "`policy bench` is now `policy measure`" in err
    assert err.rstrip().endswith("run: policy measure demo --vary runner=mrv1,mrv2")


def test_a_json_error_with_detail_lines_is_a_json_document(cli) -> None:
    # A capability error carries its ways out as detail lines: --json prints them in the
    # message, as text does, instead of failing on them with a traceback.
    code, out, _ = cli("explain", "LlamaForCausalLM", "--platform", "cuda", "--feature",
                       "has_triton=false", "--env", "VLLM_USE_V2_MODEL_RUNNER=1", "--json")
    error = json.loads(out)["error"]
    assert code == 1 and error["kind"] == "policy"
    assert error["message"].startswith("runner=mrv2 is forced by VLLM_USE_V2_MODEL_RUNNER=1")
    assert "to choose otherwise:" in error["message"]
