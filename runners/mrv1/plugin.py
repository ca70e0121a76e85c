"""mrv1 as a plugin: its declared capabilities and where its runner object lives.

Registered through the ``interlock.plugins`` entry point like any third-party
runner. Cheap to import: declarations only, the runner is loaded by path.
"""

from __future__ import annotations

from interlock.core.platform import PLATFORMS
from interlock.plugins import CUDAGRAPH_MODES, PlatformSupport, RunnerSpec, Unsupported, hookimpl


def graph_support(platform: str, requires: frozenset[str] = frozenset()) -> PlatformSupport:
    """As in vLLM: every graph mode and breakable capture, on every platform. torch.compile
    of the graph segments where graphs are CUDA graphs (torch.cuda serves HIP too);
    elsewhere graphs replay through the debug backend and compile is declared unsupported:
    stage 5 turns an automatic compile=true into false with a trace step, and a forced one
    is an error. Tensor parallelism where a torch.distributed backend serves the
    collectives, with no limit of the runner's own (the model's head counts limit the
    size, checked before loading)."""
    known = PLATFORMS[platform]
    return PlatformSupport(
        cudagraph=frozenset(CUDAGRAPH_MODES),
        breakable=True,
        compile=known.compiled_graphs,
        requires=requires,
        max_tensor_parallel_size=None if known.distributed_backend is not None else 1,
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
    platforms={platform: graph_support(platform) for platform in PLATFORMS},
    unsupported=NOT_YET_SUPPORTED,
    factory="interlock.runners.mrv1.runner:MRV1Runner",
)


@hookimpl
def interlock_runner_specs() -> list[RunnerSpec]:
    return [SPEC]
