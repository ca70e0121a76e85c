"""CountedRunner: mrv1 with its own name and spec, counting what it executes."""

from __future__ import annotations

from interlock.runners.contract import RunnerOutput, ScheduledBatch
from interlock.runners.mrv1.runner import MRV1Runner
from interlock_counted.plugin import RUNNER


class CountedRunner(MRV1Runner):
    name = RUNNER.name
    runner_spec = RUNNER

    def __init__(self) -> None:
        super().__init__()
        self.counts = {"steps": 0, "tokens": 0}

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        self.counts["steps"] += 1
        self.counts["tokens"] += batch.num_tokens
        return super().execute(batch)
