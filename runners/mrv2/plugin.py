"""mrv2 as a plugin: its declared capabilities and where its runner object lives.

mrv2 prepares inputs with kernels on the device, Triton on GPU platforms: there
it requires Triton, and an automatic choice without it falls back to mrv1.
"""

from __future__ import annotations

from plugins import CUDAGRAPH_MODES, PlatformSupport, RunnerSpec, hookimpl
from runners.mrv1.plugin import EVERY_GRAPH_MODE, NOT_YET_SUPPORTED

GPU_PLATFORMS = ("cuda", "rocm", "xpu")

ON_GPU = PlatformSupport(
    cudagraph=frozenset(CUDAGRAPH_MODES),
    breakable=True,
    compile=True,
    requires=frozenset({"has_triton"}),
)

SPEC = RunnerSpec(
    name="mrv2",
    description="model runner V2: request state kept on the device, input preparation by "
    "kernels on the device (Triton on GPU, torch on CPU)",
    plugin_api=">=1.0,<2",
    platforms={**{platform: ON_GPU for platform in GPU_PLATFORMS}, "cpu": EVERY_GRAPH_MODE},
    unsupported=NOT_YET_SUPPORTED,
    fallback="mrv1",
    factory="runners.mrv2.runner:MRV2Runner",
)


@hookimpl
def interlock_runner_specs() -> list[RunnerSpec]:
    return [SPEC]
