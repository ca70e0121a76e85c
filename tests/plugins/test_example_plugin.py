"""The example plugin really installed (pip, offline): listed, selectable by a site policy,
flagged by `policy check` once gone, and passing its own contract tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from interlock.policy.loader import shipped_policy_path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "eager-runner-plugin"
SITE_POLICY = """\
schema_version: 1
version: "site-1"
rules:
  - id: site-eager-for-llama
    when: {architecture: LlamaForCausalLM}
    set: {runner: eager}
    reason: this site debugs Llama models with the eager runner from its plugin
    ref: https://example.invalid/site/eager-runner
"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("eager-plugin")
    # Built from a copy: an in-tree build would leave build/ and *.egg-info in the example.
    source = root / "source"
    shutil.copytree(
        EXAMPLE,
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(root / "site"),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (root / "site.yaml").write_text(SITE_POLICY)
    return root


def run(
    workdir: Path,
    *args: str,
    installed: bool = True,
    module: str = "interlock.cli",
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "VLLM_"))}
    env.update(NO_COLOR="1", INTERLOCK_CACHE_DIR=str(workdir / "cache"))
    env.pop("PYTHONPATH", None)
    if installed:
        env["PYTHONPATH"] = str(workdir / "site")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def policies(workdir: Path) -> list[str]:
    return ["--policy", str(shipped_policy_path()), "--policy", str(workdir / "site.yaml")]


def test_listed_by_policy_plugins(workdir: Path) -> None:
    done = run(workdir, "plugins")
    assert done.returncode == 0, done.stderr
    assert "eager  interlock-eager-runner 0.1.0  ok" in done.stdout
    assert "  source       interlock_eager.plugin" in done.stdout
    assert (
        "cpu, cuda, rocm, xpu   cudagraph none; no breakable capture; no torch.compile"
        in done.stdout
    )
    assert "kernel silu_and_mul/eager_example" in done.stdout


def test_a_site_policy_selects_it(workdir: Path) -> None:
    done = run(workdir, "explain", "LlamaForCausalLM", "--platform", "cpu", *policies(workdir))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "runner        eager                rules site-eager-for-llama" in out
    assert "provided by plugin eager (interlock-eager-runner 0.1.0)" in out
    assert "cudagraph     none                 capabilities eager" in out
    checked = run(workdir, "check", *policies(workdir))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "unknown-runner" not in checked.stdout


def test_without_it_check_flags_the_rule_and_explain_refuses(workdir: Path) -> None:
    checked = run(workdir, "check", *policies(workdir), installed=False)
    assert checked.returncode == 1
    assert (
        "error: unknown-runner: rule site-eager-for-llama: runner 'eager' is not registered"
        in checked.stdout
    )
    explained = run(
        workdir,
        "explain",
        "LlamaForCausalLM",
        "--platform",
        "cpu",
        *policies(workdir),
        installed=False,
    )
    assert explained.returncode == 1
    assert "runner 'eager' is not registered" in explained.stderr


def test_its_own_tests_pass_installed(workdir: Path) -> None:
    source = workdir / "source"
    done = run(workdir, "-q", "-p", "no:cacheprovider", "tests", module="pytest", cwd=source)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "failed" not in done.stdout


def test_policy_run_executes_a_model_through_it(workdir: Path) -> None:
    done = run(workdir, "run", "--model", "demo", "--max-tokens", "3", "--json",
               *policies(workdir))
    assert done.returncode == 0, done.stderr
    assert "runner=eager (rules site-eager-for-llama, " in done.stderr
    doc = json.loads(done.stdout)
    assert doc["runner"]["name"] == "eager"
    assert doc["runner"]["plugin"] == "eager (interlock-eager-runner 0.1.0)"
    assert doc["decision"]["cudagraph"] == "none"  # stage 5: the plugin serves no graphs
    assert len(doc["outputs"][0]["token_ids"]) == 3
    assert doc["kernels"]["silu_and_mul"].startswith("eager_example")
