"""A runner that fails on rank 1 at its third step, for the failure tests (imported by
the spawned worker through the runner factory path)."""

from __future__ import annotations

from interlock.runners.contract import RunnerOutput, ScheduledBatch
from interlock.runners.mrv1.runner import MRV1Runner
from interlock.runners.parallel.group import current


class FaultyRunner(MRV1Runner):
    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        self.steps += 1
        if current().rank == 1 and self.steps == 3:
            raise RuntimeError("rank 1 fails at step 3 on purpose")
        return super().execute(batch)
