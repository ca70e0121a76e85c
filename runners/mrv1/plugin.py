"""mrv1 as a plugin: its declared capabilities and where its runner object lives.

Registered through the ``interlock.plugins`` entry point like any third-party
runner. Cheap to import: declarations only, the runner is loaded by path.
"""

from __future__ import annotations

from interlock.plugins import CUDAGRAPH_MODES, PlatformSupport, RunnerSpec, Unsupported, hookimpl

PLATFORMS = ("cuda", "rocm", "xpu", "cpu")
# Where graphs are CUDA graphs (torch.cuda serves HIP too) and torch.compile of
# the graph segments is honoured. Elsewhere graphs replay through the debug
# backend and compile is declared unsupported: stage 5 turns an automatic
# compile=true into false with a trace step, and a forced one is an error.
COMPILED = ("cuda", "rocm")
# Where a torch.distributed backend serves the tensor-parallel collectives: gloo on the
# CPU, NCCL (RCCL on ROCm) on GPUs. No limit of the runner's own; the model's head
# counts limit the size, checked before loading.
TENSOR_PARALLEL = ("cpu", "cuda", "rocm")


def graph_support(platform: str, requires: frozenset[str] = frozenset()) -> PlatformSupport:
    """As in vLLM: every graph mode and breakable capture, on every platform; tensor
    parallelism where torch.distributed has a backend for the device."""
    return PlatformSupport(
        cudagraph=frozenset(CUDAGRAPH_MODES),
        breakable=True,
        compile=platform in COMPILED,
        requires=requires,
        max_tensor_parallel_size=None if platform in TENSOR_PARALLEL else 1,
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
