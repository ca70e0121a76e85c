"""`policy vllm args|serve`: the vllm serve command carries every decision field explicitly.

`serve` is run as a user runs it (a subprocess: it supervises its child) with a fake `vllm`
first on PATH that records its argv and environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from checkout import REPO

FAKE_VLLM = """#!{python}
import json, os, sys
with open(os.environ["FAKE_VLLM_RECORD"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
"""
BOUND = ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH")


@pytest.fixture
def model(tmp_path: Path) -> Callable[[str], Path]:
    def make(arch: str, **config: Any) -> Path:
        path = tmp_path / arch
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"architectures": [arch], **config}))
        return path

    return make


@pytest.fixture
def serve(tmp_path: Path) -> Callable[..., tuple[subprocess.CompletedProcess[str], Any]]:
    """``serve(*args, env={...}, fake=True)``: `policy vllm serve` in a subprocess; returns the
    process and what the fake vllm recorded (None when it did not run)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(FAKE_VLLM.format(python=sys.executable))
    fake.chmod(0o755)
    record = tmp_path / "record.json"

    def run(
        *args: str, env: dict[str, str] | None = None, fake: bool = True
    ) -> tuple[subprocess.CompletedProcess[str], Any]:
        base = {k: v for k, v in os.environ.items() if k not in BOUND}
        path = str(bin_dir) if fake else "/nonexistent"
        full = {
            **base,
            "PATH": f"{path}{os.pathsep}{os.path.dirname(sys.executable)}",
            "PYTHONPATH": str(REPO),
            "FAKE_VLLM_RECORD": str(record),
            **(env or {}),
        }
        record.unlink(missing_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "interlock.cli", "vllm", "serve", *args],
            capture_output=True,
            text=True,
            env=full,
            cwd=REPO,
            check=False,
        )
        return proc, json.loads(record.read_text()) if record.exists() else None

    return run


# The shipped policy (vLLM 0.33.0) on the seed contexts: (arch, platform, device arch) ->
# (VLLM_USE_V2_MODEL_RUNNER, VLLM_USE_BREAKABLE_CUDAGRAPH, cudagraph flag, mode flag).
SEEDS = {
    ("GlmMoeDsaForCausalLM", "rocm", "gfx950"): ("1", "0", "FULL_AND_PIECEWISE", "VLLM_COMPILE"),
    ("GlmMoeDsaForCausalLM", "cuda", "sm_90"): ("1", "1", "FULL_AND_PIECEWISE", "NONE"),
    ("KimiK3ForConditionalGeneration", "rocm", "gfx950"): (
        "1",
        "0",
        "FULL_AND_PIECEWISE",
        "VLLM_COMPILE",
    ),  # fmt: skip
    ("KimiK3ForConditionalGeneration", "cuda", "sm_100"): ("1", "1", "FULL_AND_PIECEWISE", "NONE"),
    ("LongcatFlashNgramForCausalLM", "cuda", "sm_90"): ("1", "0", "FULL", "NONE"),
    ("LlamaForCausalLM", "cuda", "sm_90"): ("1", "0", "FULL_AND_PIECEWISE", "VLLM_COMPILE"),
}


@pytest.mark.parametrize(("arch", "platform", "device_arch"), sorted(SEEDS))
def test_serve_passes_every_field_explicitly(
    serve: Any, model: Any, arch: str, platform: str, device_arch: str
) -> None:
    path = model(arch)
    proc, seen = serve(
        "--platform", platform, "--device-arch", device_arch, str(path), "--port", "8001"
    )
    assert proc.returncode == 0, proc.stderr
    runner, breakable, cudagraph, mode = SEEDS[(arch, platform, device_arch)]
    assert seen["argv"] == [
        "serve", str(path), f"-cc.cudagraph_mode={cudagraph}", f"-cc.mode={mode}", "--port", "8001",
    ]  # fmt: skip
    assert seen["env"]["VLLM_USE_V2_MODEL_RUNNER"] == runner
    assert seen["env"]["VLLM_USE_BREAKABLE_CUDAGRAPH"] == breakable
    # The one-line provenance names who chose each field.
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("policy vllm: " + arch)]
    assert "runner=mrv2 (defaults, policies.yaml:" in line


def test_user_flags_win_and_pass_through(serve: Any, model: Any) -> None:
    proc, seen = serve(
        "--platform", "cuda", str(model("LlamaForCausalLM")), "-cc.cudagraph_mode", "full",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # Ours is left out for the field the user gave; theirs passes through as written.
    assert seen["argv"][2:] == ["-cc.mode=VLLM_COMPILE", "-cc.cudagraph_mode", "full"]
    assert "cudagraph=full (overrides override)" in proc.stderr


def test_user_env_wins_and_enters_the_resolution(serve: Any, model: Any) -> None:
    proc, seen = serve(
        "--platform", "cuda", "--device-arch", "sm_90", str(model("GlmMoeDsaForCausalLM")),
        env={"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert seen["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert seen["env"]["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    # Breakable off from the env: compiled graphs again.
    assert seen["argv"][2:] == ["-cc.cudagraph_mode=FULL_AND_PIECEWISE", "-cc.mode=VLLM_COMPILE"]
    assert "runner=mrv1 (env VLLM_USE_V2_MODEL_RUNNER" in proc.stderr


def test_missing_vllm_is_a_one_line_hint(serve: Any, model: Any) -> None:
    proc, seen = serve("--platform", "cuda", str(model("LlamaForCausalLM")), fake=False)
    assert proc.returncode == 1 and seen is None
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("policy: error:")]
    assert errors == [
        "policy: error: vllm is not on PATH: install vLLM or activate its environment, or "
        "give --vllm PATH (`policy vllm args MODEL` prints the command instead)"
    ]
    assert "Traceback" not in proc.stderr


def test_args_prints_the_command(cli: Any, model: Any) -> None:
    path = model("GlmMoeDsaForCausalLM")
    result = cli("vllm", "args", "--platform", "rocm", "--device-arch", "gfx950", path)
    assert result.code == 0, result.err
    assert result.out == (
        "VLLM_USE_V2_MODEL_RUNNER=1 VLLM_USE_BREAKABLE_CUDAGRAPH=0 vllm serve "
        f"{path} -cc.cudagraph_mode=FULL_AND_PIECEWISE -cc.mode=VLLM_COMPILE\n"
    )


def test_args_json_shows_the_override_in_the_trace(cli: Any, model: Any) -> None:
    path = model("LlamaForCausalLM")
    result = cli("vllm", "args", "--json", "--platform", "cuda", path, "-cc.mode=NONE")
    doc = result.json()
    # Compile off without breakable graphs: vLLM lowers full_and_piecewise.
    assert doc["decision"]["cudagraph"] == "full_decode_only"
    assert doc["adjustments"][0]["from"] == "full_and_piecewise"
    assert doc["resolution"]["provenance"]["compile"]["stage"] == "overrides"
    assert doc["argv"][3:] == ["-cc.cudagraph_mode=FULL_DECODE_ONLY", "-cc.mode=NONE"]
    assert doc["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}


def test_a_forced_value_vllm_would_change_is_refused(cli: Any, model: Any) -> None:
    path = model("LlamaForCausalLM")
    result = cli(
        "vllm", "args", "--platform", "cuda", path, "-cc.mode=NONE", "-cc.cudagraph_mode=PIECEWISE"
    )
    assert result.code == 1
    assert ("vLLM (version unknown) would run cudagraph=none, not the piecewise asked for "
            "with ") in result.err
    assert "-cc.cudagraph_mode PIECEWISE" in result.err


def test_pooling_runner_is_captured_piecewise(cli: Any, model: Any) -> None:
    path = model("LlamaForCausalLM")
    result = cli("vllm", "args", "--json", "--platform", "cuda", path, "--runner", "pooling")
    assert result.json()["decision"]["cudagraph"] == "piecewise"


def test_options_after_model_are_refused(cli: Any, model: Any) -> None:
    result = cli("vllm", "args", model("LlamaForCausalLM"), "--platform", "cuda")
    assert result.code == 1
    assert "--platform comes after MODEL" in result.err


def test_bad_compilation_mode_names_the_flag(cli: Any, model: Any) -> None:
    result = cli("vllm", "args", "--platform", "cuda", model("LlamaForCausalLM"), "-cc.mode=FOO")
    assert result.code == 1
    assert "-cc.mode FOO" in result.err and "VLLM_COMPILE" in result.err
