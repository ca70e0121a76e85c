"""mrv1 as a plugin: its declared capabilities and where its runner object lives.

Registered through the ``interlock.plugins`` entry point like any third-party
runner. Cheap to import: declarations only, the runner is loaded by path.
"""

from __future__ import annotations

from plugins import CUDAGRAPH_MODES, PlatformSupport, RunnerSpec, Unsupported, hookimpl

PLATFORMS = ("cuda", "rocm", "xpu", "cpu")

# As in vLLM: every graph mode, breakable capture (on cpu through the debug
# replay backend) and torch.compile.
EVERY_GRAPH_MODE = PlatformSupport(
    cudagraph=frozenset(CUDAGRAPH_MODES), breakable=True, compile=True
)

# Declared so that asking for them is an error naming the feature, not a crash mid-run.
NOT_YET_SUPPORTED = (
    Unsupported(
        feature="pipeline parallelism",
        when={"features": {"pipeline_parallel_size": {"gt": 1}}},
    ),
    Unsupported(
        feature="speculative decoding",
        when={"features": {"speculative": {"ne": False}}},
    ),
)

SPEC = RunnerSpec(
    name="mrv1",
    description="classic model runner: per-step input preparation on the host (numpy), "
    "copied into static device buffers",
    plugin_api=">=1.0,<2",
    platforms={platform: EVERY_GRAPH_MODE for platform in PLATFORMS},
    unsupported=NOT_YET_SUPPORTED,
    factory="runners.mrv1.runner:MRV1Runner",
)


@hookimpl
def interlock_runner_specs() -> list[RunnerSpec]:
    return [SPEC]
