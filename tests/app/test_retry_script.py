"""tools/retry.sh: every install from a registry is tried again when a download breaks (the CI
run of 6c377eb lost a triton wheel at the same byte through all of pip's own resumes)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
RETRY = ROOT / "tools" / "retry.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(tmp_path: Path, script: str, times: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RETRY_TIMES": str(times), "RETRY_PAUSE": "0"}
    return subprocess.run([str(RETRY), "bash", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_command_that_fails_once_succeeds_on_the_second_try(tmp_path: Path) -> None:
    # fails while the file is absent, and makes it: a download that broke once
    done = _run(tmp_path, "[ -e tried ] && echo installed || { touch tried; exit 1; }", times=3)
    assert done.returncode == 0
    assert done.stdout == "installed\n"
    assert "try 1 of 3 failed (exit 1)" in done.stderr


def test_a_command_that_always_fails_keeps_its_exit_code_after_the_last_try(
        tmp_path: Path) -> None:
    done = _run(tmp_path, "echo x >> tries; exit 3", times=2)
    assert done.returncode == 3
    assert (tmp_path / "tries").read_text() == "x\nx\n"
    assert "gave up after 2 tries (exit 3)" in done.stderr


def test_every_registry_install_of_the_build_goes_through_the_retry() -> None:
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines()
                if re.search(r"\bpip install\b", line) and not line.lstrip().startswith("#")]
    assert installs, "the Makefile installs nothing?"
    assert [line for line in installs if "$(RETRY)" not in line] == []
    probe = (ROOT / "tools" / "vllm_probe" / "setup_venv.sh").read_text()
    assert re.search(r'^pip=".*/retry\.sh \$venv/bin/python -m pip"$', probe, re.MULTILINE)
    assert "python -m pip install" not in probe.replace("$pip install", "")
