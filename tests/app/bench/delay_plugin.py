"""A test-only runner plugin with known costs: the example eager runner plus one sleep per
step whose length depends on the decision (5 ms, 30 ms more for runner ``slow``, 12 ms
more with ``breakable``, nothing for the cudagraph mode, no interaction), so a bench
must find exactly those effects. Every configuration sleeps once per step, so the
wake-up latency of a sleep (milliseconds on a busy machine) is common to all of them
and cancels out of every effect. Runner ``rigid`` serves neither breakable nor
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


#: The last stretch of a delay is spun, not slept: how late a sleeper wakes up on a busy
#: machine grows with how long it slept, which would add an interaction of its own.
SPIN_S = 0.002


def sleep_until(deadline: float) -> None:
    """Sleep until ``SPIN_S`` before ``deadline`` (perf_counter), then spin to it."""
    while (left := deadline - time.perf_counter()) > SPIN_S:
        time.sleep(left - SPIN_S)
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
        sleep_until(time.perf_counter() + self.delay_s)
        return output


class SlowRunner(FastRunner):
    base_s = BASE_S + SLOW_S
