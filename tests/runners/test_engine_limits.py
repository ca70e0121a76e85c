"""The engine's limits live in one run configuration (``ModelSpec``) that LLM builds once:
the KV cache plan, the scheduler and the runner read the same object.

Before, ``max_num_seqs`` was held by ModelSpec (the runner's), EngineConfig and
SchedulerConfig; an engine built with a larger EngineConfig.max_num_seqs than its ModelSpec
scheduled more requests than mrv2's request state holds, and generation died with
``RuntimeError: ... the engine scheduled more requests than max_num_seqs``.
"""

from __future__ import annotations

import inspect

from interlock.llm import LLM
from interlock.runners.batching.kv_cache import plan_kv_cache
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.batching.step_loop import StepLoop
from interlock.runners.contract import Decision, ModelSpec, RunnerOutput, ScheduledBatch
from interlock.runners.model.demo import demo_config
from interlock.runners.mrv2.runner import MRV2Runner

PROMPTS = [[1, 2], [3, 4], [5, 6], [7, 8]]


class CountingMRV2(MRV2Runner):
    """mrv2, recording how many sequences each step holds."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[int] = []

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        self.widths.append(len(batch.sequences))
        return super().execute(batch)


def test_the_engine_takes_its_limits_from_the_run_configuration_alone() -> None:
    assert list(inspect.signature(StepLoop).parameters) == ["model", "kv_cache", "runner",
                                                          "decision"]


def test_more_prompts_than_max_num_seqs_run_on_mrv2_within_its_request_state() -> None:
    spec = ModelSpec("demo", demo_config(), "float32", "cpu", max_model_len=64, max_num_seqs=2,
                     max_num_batched_tokens=64)
    runner = CountingMRV2()
    engine = StepLoop(spec, plan_kv_cache(spec, 16, num_blocks=32), runner,
                    Decision(runner="mrv2"))
    requests = [engine.make_request(p, SamplingParams(temperature=0,
        max_tokens=2)) for p in PROMPTS]
    for request in requests:
        engine.add_request(request)
    while engine.has_unfinished():
        engine.step()
    assert [len(r.output_token_ids) for r in requests] == [2] * 4
    assert max(runner.widths) == 2
    assert engine.scheduler.model is spec


def test_llm_builds_the_configuration_once_for_cache_scheduler_and_runner() -> None:
    runner = CountingMRV2()
    llm = LLM("demo", max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64,
              num_blocks=32, runner=runner, decision=Decision(runner="mrv2"))
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=2))
    assert [len(o.token_ids) for o in outputs] == [2] * 4
    assert max(runner.widths) == 2
    assert llm.step_loop.model is llm.step_loop.scheduler.model is runner.model_spec
    assert llm.step_loop.model.max_num_seqs == 2
