"""What interlock imports to learn about the plugin: the spec only (cheap, no torch)."""

from __future__ import annotations

from interlock.plugins import RunnerSpec, hookimpl
from interlock.runners.mrv1.plugin import SPEC as MRV1

# What mrv1 serves, where mrv1 serves it: the subclass runs mrv1's code.
RUNNER = RunnerSpec(
    name="counted",
    description="mrv1, counting the steps and tokens it executes",
    plugin_api=">=1.0,<2",
    platforms=MRV1.platforms,
    unsupported=MRV1.unsupported,
    factory="interlock_counted.runner:CountedRunner",
    fallback="mrv1",
)


@hookimpl
def interlock_runner_specs() -> list[RunnerSpec]:
    return [RUNNER]
