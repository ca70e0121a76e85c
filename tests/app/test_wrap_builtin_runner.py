"""Issue 24 item 12: the documented way to build a runner on mrv1 (subclass it with its own
``name`` and ``runner_spec``), as examples/wrapped-runner-plugin does, runs; wrapping an
``MRV1Runner()`` as it is fails with a message that says who refused and what to do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from interlock import plugins
from interlock.testing import register_plugin  # noqa: F401  (a fixture)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wrapped-runner-plugin"


@pytest.fixture
def counted(register_plugin, monkeypatch):  # noqa: F811
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from interlock_counted import plugin

    register_plugin(plugin, "counted", distribution="interlock-counted-runner", version="0.1.0")
    yield plugin
    for name in [m for m in sys.modules if m.startswith("interlock_counted")]:
        del sys.modules[name]
    plugins.reset()


def test_the_example_runs_the_demo_model_through_mrv1s_code(cli, counted) -> None:
    res = cli("run", "--model", "demo", "--set", "runner=counted", "--max-tokens", "4",
              "--prompt-token-ids", "1,2,3", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["decision"]["runner"] == "counted"
    same = cli("run", "--model", "demo", "--set", "runner=mrv1", "--max-tokens", "4",
               "--prompt-token-ids", "1,2,3", "--json").json()
    assert [o["token_ids"] for o in doc["outputs"]] == [o["token_ids"] for o in same["outputs"]]


def test_the_subclass_counts_what_it_executes(counted) -> None:
    from interlock import LLM
    from interlock.app.runner_creation import runner_from_plugin

    runner = runner_from_plugin("counted")
    inner = getattr(runner, "inner", runner)
    assert type(inner).__name__ == "CountedRunner" and inner.counts == {"steps": 0, "tokens": 0}
    llm = LLM("demo", overrides={"runner": "counted"})
    llm.generate([[1, 2, 3]])
    engine_runner = llm.step_loop.runner
    counts = getattr(engine_runner, "inner", engine_runner).counts
    assert counts["steps"] >= 1 and counts["tokens"] >= 3


def test_a_plain_mrv1_object_says_who_refused(tmp_path) -> None:
    from interlock.runners.contract import Decision
    from interlock.runners.graphs.runner import RunnerError
    from interlock.runners.mrv1.runner import MRV1Runner

    runner = MRV1Runner()
    with pytest.raises(RunnerError) as info:
        runner._check(Decision("counted", "none"), "cpu", 1)
    message = str(info.value)
    assert message.startswith(
        "runner mrv1 (interlock.runners.mrv1.runner.MRV1Runner) refuses the decision"
    )
    assert "subclasses MRV1Runner and sets its own name" in message
    assert "examples/wrapped-runner-plugin" in message
