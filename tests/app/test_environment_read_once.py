"""The environment is read once, where a run starts: after the decision, nothing reads an
``INTERLOCK_*`` variable (interlock/app/query.py's promise), through the load, the graph
captures, generation and the close."""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from interlock.app import query
from interlock.core.env import VARIABLES

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAMES = {v.name for v in VARIABLES}


class Watched(MutableMapping[str, str]):
    """The process environment, noting each registered variable read once ``decided``."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real
        self.decided = False
        self.late: list[str] = []

    def _note(self, key: str) -> None:
        if self.decided and key in NAMES:
            where = next(f for f in reversed(traceback.extract_stack()[:-2])
                         if "_collections_abc" not in f.filename)
            self.late.append(f"{key} read at {where.filename}:{where.lineno}")

    def __getitem__(self, key: str) -> str:
        self._note(key)
        return self.real[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self._note(key)
        return key in self.real

    def __setitem__(self, key: str, value: str) -> None:
        self.real[key] = value

    def __delitem__(self, key: str) -> None:
        del self.real[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.real)

    def __len__(self) -> int:
        return len(self.real)

    def copy(self) -> dict[str, str]:
        return dict(self.real)


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Watched:
    """Every registered variable set (a read of an unset one is noted too), then the
    environment watched from the moment a query is decided."""
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("INTERLOCK_DECISION_LOG", str(tmp_path / "decisions.jsonl"))
    monkeypatch.setenv("INTERLOCK_KERNELS", "torch")
    monkeypatch.setenv("INTERLOCK_DEBUG_GRAPHS", "1")
    monkeypatch.setenv("INTERLOCK_GRAPHS_FAIL_CAPTURE", "2")
    monkeypatch.delenv("INTERLOCK_POLICY", raising=False)
    env = Watched(os.environ)
    monkeypatch.setattr(os, "environ", env)
    real = query.decide_query

    def decided(*args: Any, **kwargs: Any) -> Any:
        resolution = real(*args, **kwargs)
        env.decided = True
        return resolution

    monkeypatch.setattr(query, "decide_query", decided)
    # the modules that hold the name of their own (imported before the test patched it)
    monkeypatch.setattr("interlock.llm.decide_query", decided)
    monkeypatch.setattr("interlock.measure.harness.decide_query", decided)
    return env


def test_an_llm_reads_nothing_of_the_environment_after_its_decision(
    watched: Watched, tiny_models: Any,
) -> None:
    from interlock.llm import LLM
    from interlock.runners.batching.sampling import SamplingParams

    llm = LLM(tiny_models.path("llama"), num_blocks=8, max_model_len=32, max_num_seqs=2,
              max_num_batched_tokens=8, device="cpu")
    assert watched.decided
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3))
    report = llm.report()
    llm.close()
    assert watched.late == [], watched.late
    # What was read before the decision reached the run: the forced kernels, the debug
    # graph backend, the capture made to fail, the decision log.
    assert {k.implementation for k in report.kernels} == {"torch (interlock)"}
    assert report.graphs is not None and report.graphs.backend == "debug"
    assert any("forced by $INTERLOCK_GRAPHS_FAIL_CAPTURE" in why
               for why in report.graphs.failed.values())
    assert Path(os.environ["INTERLOCK_DECISION_LOG"]).is_file()


def test_policy_run_reads_nothing_of_the_environment_after_its_decision(
    watched: Watched, tiny_models: Any, cli: Any,
) -> None:
    result = cli("run", "--model", tiny_models.path("llama"), "--max-tokens", "2", "--json")
    assert result.code == 0, result.err
    assert watched.decided
    assert watched.late == [], watched.late


def test_policy_measure_reads_nothing_of_the_environment_after_its_decision(
    watched: Watched, tiny_models: Any, cli: Any, tmp_path: Path,
) -> None:
    # Every configuration's LLM is handed the settings the command read where it started.
    result = cli("measure", tiny_models.path("llama"), "--load-format", "dummy",
                 "--vary", "runner=mrv1,mrv2", "--prompt-len", "4", "--max-tokens", "2",
                 "--batch-sizes", "1", "--warmup", "0", "--trials", "2",
                 "--record", tmp_path / "record.json")
    assert result.code == 0, result.err
    assert watched.decided
    assert watched.late == [], watched.late
