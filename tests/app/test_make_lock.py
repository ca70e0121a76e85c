"""`make lock` (issue 51 item 12): it writes the lock only from a `.venv-latest` the suite
passed in (`make test-latest` leaves the proof there only on success), through a temporary
file, so a failing `pip freeze` leaves the lock as it was. The Makefile's own recipes run here,
against a fake `.venv-latest` whose `python -m pip freeze` prints what the test says."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
LOCK_TEXT = "# the lock as it was\naccelerate==1.15.0\npyyaml==6.0.3\n"
FREEZE = "accelerate==1.16.0\npip==26.0\npyyaml==6.0.3\ntorch==2.13.0+cpu\n"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _script(freeze: Path, code: int) -> str:
    """A fake ``python`` that answers ``-m pip freeze ...`` with the file ``freeze`` and
    exits ``code``."""
    return f'#!/bin/sh\n[ "$1 $2 $3" = "-m pip freeze" ] || exit 9\ncat "{freeze}"\nexit {code}\n'


def _python(venv: Path, freeze: str, code: int) -> None:
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "freeze.txt").write_text(freeze)
    (venv / "bin" / "python").write_text(_script(venv / "freeze.txt", code))
    (venv / "bin" / "python").chmod(0o755)


def _make(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", "-C", str(where), *args, "TORCH_INDEX_URL="],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "constraints.txt").write_text(LOCK_TEXT)
    return tmp_path


def test_lock_refuses_without_the_proof_that_the_suite_passed(checkout: Path) -> None:
    _python(checkout / ".venv-latest", FREEZE, 0)
    result = _make(checkout, "lock")
    assert result.returncode != 0
    assert "run make test-latest first" in result.stderr
    assert (checkout / "constraints.txt").read_text() == LOCK_TEXT


def test_a_failing_freeze_leaves_the_lock_as_it_was(checkout: Path) -> None:
    venv = checkout / ".venv-latest"
    _python(venv, FREEZE, 0)
    (venv / "suite-passed-with.txt").write_text(FREEZE)
    _python(venv, "accelerate==1.16.0\n", 1)  # half a freeze, then a failure
    result = _make(checkout, "lock")
    assert result.returncode != 0
    assert (checkout / "constraints.txt").read_text() == LOCK_TEXT


def test_lock_refuses_a_venv_changed_since_the_suite_passed(checkout: Path) -> None:
    venv = checkout / ".venv-latest"
    _python(venv, FREEZE.replace("6.0.3", "7.0.0"), 0)
    (venv / "suite-passed-with.txt").write_text(FREEZE)
    result = _make(checkout, "lock")
    assert result.returncode != 0 and "changed since make test-latest passed" in result.stderr
    assert (checkout / "constraints.txt").read_text() == LOCK_TEXT


@pytest.mark.parametrize("suite", [0, 1])
def test_test_latest_leaves_the_proof_only_when_the_suite_passed(
    checkout: Path, suite: int
) -> None:
    # $(MAKE) stands in for `make test` in .venv-latest: it makes the venv and exits as the
    # suite did.
    venv = checkout / ".venv-latest"
    (checkout / "freeze.txt").write_text(FREEZE)
    (checkout / "python").write_text(_script(checkout / "freeze.txt", 0))
    fake_make = checkout / "fake-make.sh"
    fake_make.write_text(f'#!/bin/sh\nmkdir -p "{venv}/bin"\ncp "{checkout}/python" '
                         f'"{venv}/bin/python"\nchmod +x "{venv}/bin/python"\nexit {suite}\n')
    fake_make.chmod(0o755)
    result = _make(checkout, "test-latest", f"MAKE={fake_make}")
    assert (result.returncode == 0) == (suite == 0), result.stderr
    assert (venv / "suite-passed-with.txt").exists() == (suite == 0)
    locked = _make(checkout, "lock")
    if suite:
        assert locked.returncode != 0 and "run make test-latest first" in locked.stderr
        assert (checkout / "constraints.txt").read_text() == LOCK_TEXT
    else:
        assert locked.returncode == 0, locked.stderr
        lines = (checkout / "constraints.txt").read_text().splitlines()
        assert lines[0].startswith("# The versions `make test` last passed with")
        assert lines[1:] == ["accelerate==1.16.0", "pyyaml==6.0.3"]
        assert not list(venv.glob("lock.*new"))
