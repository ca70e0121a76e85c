"""mrv2 as a plugin: its declared capabilities and where its runner object lives.

mrv2 prepares inputs with kernels on the device, Triton on GPU platforms: there
it requires Triton, and an automatic choice without it falls back to mrv1.
"""

from __future__ import annotations

from interlock.core.platform import PLATFORMS, TRITON_FACT
from interlock.plugins import RunnerSpec, hookimpl
from interlock.runners.mrv1.plugin import NOT_YET_SUPPORTED, graph_support

#: What mrv2 requires where its input preparation runs Triton kernels (GPU platforms):
#: the one statement of that need; its runner reads it back from the spec.
TRITON = frozenset({TRITON_FACT})

SPEC = RunnerSpec(
    name="mrv2",
    description="model runner V2: request state kept on the device, input preparation by "
    "kernels on the device (Triton on GPU, torch on CPU)",
    plugin_api=">=1.0,<2",
    platforms={
        name: graph_support(name, TRITON if platform.gpu else frozenset())
        for name, platform in PLATFORMS.items()
    },
    unsupported=NOT_YET_SUPPORTED,
    fallback="mrv1",
    factory="interlock.runners.mrv2.runner:MRV2Runner",
)


@hookimpl
def interlock_runner_specs() -> list[RunnerSpec]:
    return [SPEC]
