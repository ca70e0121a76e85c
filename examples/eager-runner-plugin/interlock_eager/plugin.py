"""The declarations interlock reads: the runner spec and one extra kernel implementation.

Imports only interlock's public plugin API, and no torch.
"""

from __future__ import annotations

from interlock.plugins import (
    PLATFORM_NAMES,
    KernelSpec,
    PlatformSupport,
    RunnerSpec,
    Unsupported,
    hookimpl,
)

PLUGIN_API = ">=1.0,<2"

# Eager on every platform interlock knows: no graph mode but `none`, no
# breakable capture, no torch.compile. Stage 5 downgrades a policy's graph
# settings to that (with a trace step) and refuses forced ones.
EAGER = PlatformSupport(cudagraph={"none"})

RUNNER = RunnerSpec(
    name="eager",
    description="every step eager: inputs prepared with torch on the device, no graph capture",
    plugin_api=PLUGIN_API,
    platforms={platform: EAGER for platform in PLATFORM_NAMES},
    unsupported=(
        Unsupported("pipeline parallelism", {"features": {"pipeline_parallel_size": {"gt": 1}}}),
        Unsupported("speculative decoding", {"features": {"speculative": {"ne": False}}}),
    ),
    factory="interlock_eager.runner:EagerRunner",
)

# The runner prefers this implementation of silu_and_mul (see runner.py): a
# plugin may bring kernels, and they take part in the registry's dispatch.
SILU_AND_MUL = KernelSpec(
    op="silu_and_mul",
    backend="eager_example",
    target="interlock_eager.kernels:silu_and_mul",
    platforms=set(PLATFORM_NAMES),
    dtypes={"float32", "bfloat16", "float16"},
    plugin_api=PLUGIN_API,
)


@hookimpl
def interlock_runner_specs() -> list[RunnerSpec]:
    return [RUNNER]


@hookimpl
def interlock_kernel_specs() -> list[KernelSpec]:
    return [SILU_AND_MUL]
