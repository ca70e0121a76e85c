"""A test-only runner plugin with known costs: the example eager runner plus one busy-wait per
step whose length depends on the decision (5 ms, 30 ms more for runner ``slow``, 12 ms
more with ``breakable``, nothing for the cudagraph mode, no interaction), so a bench
must find exactly those effects. Runner ``rigid`` serves neither breakable nor
piecewise."""

from __future__ import annotations

import dataclasses
import sys
import time

from checkout import REPO

from interlock.plugins import PlatformSupport, RunnerSpec, hookimpl

EXAMPLE = REPO / "examples" / "eager-runner-plugin"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

from interlock_eager.runner import EagerRunner  # noqa: E402

BASE_S = 0.005
SLOW_S = 0.030
BREAKABLE_S = 0.012

SERVES = PlatformSupport(cudagraph={"none", "piecewise"}, breakable=True)


def _spec(name: str, cls: str, support: PlatformSupport) -> RunnerSpec:
    return RunnerSpec(
        name=name,
        description=f"test runner {name}: eager plus a known sleep per step",
        plugin_api=">=1.0,<2",
        platforms={"cpu": support},
        factory=f"delay_plugin:{cls}",
    )


class DelayPlugin:
    @hookimpl
    def interlock_runner_specs(self) -> list[RunnerSpec]:
        return [
            _spec("fast", "FastRunner", SERVES),
            _spec("slow", "SlowRunner", SERVES),
            _spec("rigid", "FastRunner", PlatformSupport(cudagraph={"none"})),
        ]


def spin_until(deadline: float) -> None:
    """Busy-wait until ``deadline`` (perf_counter). A delay is spun, never slept: a core
    left idle runs the next step slower the longer it idled (the tiny model's step took
    1.8 ms after sleeps against 1.45 ms after spins, and unevenly), which gave the delays
    an interaction of -0.2 to -0.4 ms that made the two-by-two test fail in CI."""
    while time.perf_counter() < deadline:
        pass


class FastRunner(EagerRunner):
    base_s = BASE_S

    def load(self, model, kv_cache, decision):  # type: ignore[no-untyped-def]
        self.delay_s = self.base_s + (BREAKABLE_S if decision.breakable else 0.0)
        # The wrapped eager runner serves only eager: graphs here are a label that costs time.
        eager = dataclasses.replace(decision, cudagraph="none", breakable=False, compile=False)
        super().load(model, kv_cache, eager)

    def execute(self, batch):  # type: ignore[no-untyped-def]
        output = super().execute(batch)
        spin_until(time.perf_counter() + self.delay_s)
        return output


class SlowRunner(FastRunner):
    base_s = BASE_S + SLOW_S
