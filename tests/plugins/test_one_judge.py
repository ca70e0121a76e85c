"""One judge decides whether a runner serves a decision: ``RunnerSpec.unserved``. Stage 5,
the built-in runners' load check, `policy check`'s lint and the plugin test kit ask it."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_builders import EVERY_MODE, spec

import interlock.runners.mrv1.plugin
import interlock.testing.checks as checks
from interlock.core.decision import Decision
from interlock.plugins import PlatformSupport, RunnerSpec, load_registry
from interlock.plugins.capabilities import capability_stage
from interlock.plugins.checks import unserved_cudagraph
from interlock.plugins.spec import CONTEXT, FIELD, IMPLICATION
from interlock.policy.context import make_context
from interlock.policy.loader import load_policy
from interlock.policy.resolution import resolve
from interlock.runners.graphs.runner import RunnerError
from interlock.runners.mrv1.runner import MRV1Runner

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Every call of the judge, as (runner, platform)."""
    calls: list[tuple[str, str]] = []
    judge = RunnerSpec.unserved

    def spy(self: RunnerSpec, decision: Decision, platform: str, **kw: object) -> list:
        calls.append((self.name, platform))
        return judge(self, decision, platform, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(RunnerSpec, "unserved", spy)
    yield calls


def test_stage_5_asks_the_judge(asked: list[tuple[str, str]]) -> None:
    context = make_context("LlamaForCausalLM", platform="cuda", features={"has_triton": False})
    res = resolve(load_policy(), context, capabilities=capability_stage())
    assert res.decision.runner == "mrv1"  # mrv2 requires Triton: the judge said so
    assert ("mrv2", "cuda") in asked and ("mrv1", "cuda") in asked


def test_the_runners_load_check_asks_the_judge(asked: list[tuple[str, str]]) -> None:
    with pytest.raises(RunnerError, match="mrv1 does not serve torch.compile with breakable "
                                          "capture on cuda"):
        MRV1Runner()._check(Decision(breakable=True, compile=True), "cuda", 1)
    assert asked == [("mrv1", "cuda")]


def test_the_lint_asks_the_judge(asked: list[tuple[str, str]]) -> None:
    assert unserved_cudagraph(load_registry(), "full", ["cpu", "cuda"]) == []
    assert {("mrv1", "cpu"), ("mrv1", "cuda")} <= set(asked)


def test_the_conformance_kit_asks_the_judge(
    asked: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Decision] = []

    def generate(model: object, platform: str, runner: object, decision: Decision) -> list:
        ran.append(decision)
        return [[1]]

    monkeypatch.setattr(checks, "_generate", generate)
    record = checks.load_under_test(interlock.runners.mrv1.plugin, "mrv1")
    assert checks.check_runs_tiny_model(record) == []
    assert ("mrv1", "cpu") in asked
    assert [d.cudagraph for d in ran[1:]] == [*EVERY_MODE.cudagraph, "full_and_piecewise"]


def test_nothing_else_judges() -> None:
    assert not hasattr(PlatformSupport, "serves") and not hasattr(PlatformSupport, "offers")
    sources = [p for top in ("interlock", "core", "policy", "runners", "kernels", "plugins")
               for p in (REPO / top).rglob("*.py")]
    callers = {p.name for p in sources if "_unserved_fields(" in p.read_text()}
    assert callers == {"spec.py"}
    assert "def unserved(" in inspect.getsource(RunnerSpec)


def test_what_the_judge_finds() -> None:
    runner = spec("gpu", {"cuda": PlatformSupport(cudagraph={"none", "full"},
                                                  requires={"has_triton"})})
    assert [(u.kind, u.field) for u in runner.unserved(Decision("gpu"), "cpu")] == [
        (CONTEXT, "platform")
    ]
    found = runner.unserved(
        Decision("gpu", "piecewise", breakable=True, compile=True), "cuda",
        tensor_parallel_size=2, facts={"has_triton": False},
    )
    assert [(u.kind, u.field, str(u)) for u in found] == [
        (CONTEXT, "requires", "Triton"),
        (CONTEXT, "tensor_parallel_size", "tensor_parallel_size=2"),
        (FIELD, "cudagraph", "cudagraph=piecewise"),
        (FIELD, "breakable", "breakable capture"),
        (FIELD, "compile", "torch.compile"),
        (IMPLICATION, "compile", "torch.compile with breakable capture"),
    ]
    assert runner.unserved(Decision("gpu", "full"), "cuda") == []  # has_triton assumed
