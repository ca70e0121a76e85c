"""The hostile harness itself: a fresh interpreter per case, and limits that hold."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hostile import bounded as harness


def _pid_and_threads() -> tuple[int, int]:
    return os.getpid(), threading.active_count()


def _sleep_in_c() -> None:
    time.sleep(3600)


def _allocate(nbytes: int) -> int:
    return len(bytearray(nbytes))


def _raise_documented() -> None:
    from interlock.core.errors import PolicyError

    raise PolicyError("a documented refusal")


def test_a_case_runs_in_a_fresh_interpreter() -> None:
    torch = pytest.importorskip("torch")
    torch.ones(64, 64) @ torch.ones(64, 64)  # this process now has torch's thread pool
    outcome = harness.bounded(_pid_and_threads)
    pid, threads = outcome[1]
    assert outcome[0] == "ok" and pid != os.getpid() and threads == 1


def test_a_case_stuck_in_c_code_is_killed_at_the_wall_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness, "WALL_SECONDS", 3)
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="ran past 3 s and was killed"):
        harness.bounded(_sleep_in_c)
    assert time.monotonic() - start < 30


def test_the_address_space_limit_holds() -> None:
    with pytest.raises(AssertionError, match="MemoryError"):
        harness.bounded(_allocate, harness.ADDRESS_SPACE)


def test_a_documented_error_is_an_outcome_not_a_failure() -> None:
    assert harness.bounded(_raise_documented) == ("error", "policy")
