"""Low-level capture backends shared by every runner: ``cuda``, ``native`` and ``debug``.

Each turns a callable into a replayable segment and a whole forward into a
breakable program; they differ only in what replay does.

* ``cuda`` records ``torch.cuda.CUDAGraph`` s (the same API serves ROCm/HIP
  builds of torch) on a side stream. All graphs of a runner share one memory
  pool; a runner replays one program at a time and reads its outputs before
  the next, which is what makes the sharing safe.
* ``debug`` keeps the callables and replays them eagerly, copying results into
  the outputs the "capture" produced. Capture plans, static buffers, padding,
  segments and breaks are exactly those of ``cuda``, so a bug that shows up
  under both is a model bug and one that only shows up under ``cuda`` is a
  graph bug. It is what runs on CPU and what ``ModelSpec.debug_graphs`` (``policy run
  --debug-graphs``, ``LLM(debug_graphs=True)``, ``INTERLOCK_DEBUG_GRAPHS=1``) forces on a GPU.
* ``native`` (CPU) records the native kernels' calls into tapes
  (``interlock.kernels.native.tape``) and replays a tape in one C call, with no Python
  or torch dispatch between the kernels: the CPU's counterpart of a CUDA graph, with the
  same static buffers. Other backends' ops and a tensor-parallel group's collectives are
  recorded as Python calls between the runs of native kernels. A forward that runs any
  other op cannot be taped, and that key runs eagerly (the graphs report says why).
  ``auto`` takes it on the CPU when the kernel table chose the native kernels.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from interlock.runners.graphs.segments import (
    AttentionBreak,
    Outputs,
    Program,
    Segment,
    SegmentedProgram,
    SegmentFn,
    as_outputs,
)
from interlock.runners.model.attention import (
    AttentionLayer,
    AttentionMetadata,
    attention_split,
)

if TYPE_CHECKING:
    from interlock.kernels.native.tape import Tape

BACKENDS = ("auto", "cuda", "native", "debug")


class CaptureError(RuntimeError):
    """A segment could not be captured; the runner runs the affected size eagerly."""


class GraphBackend(Protocol):
    name: str

    def capturing(self) -> AbstractContextManager[None]:
        """Where captures happen (the cuda backend's side stream)."""
        ...

    def capture(self, fn: SegmentFn) -> tuple[Segment, Outputs]:
        """One segment of ``fn`` and its static outputs."""
        ...

    def capture_breakable(self, fn: SegmentFn) -> Program:
        """``fn`` cut at every attention split point it reaches while being captured."""
        ...


def select_backend(requested: str, device: torch.device, tapeable: bool = False,
                   *, debug: bool = False) -> GraphBackend:
    """``auto``: unless ``debug`` (``ModelSpec.debug_graphs``), cuda on a CUDA/ROCm device and
    native on the CPU when the forward is ``tapeable`` (its kernel table chose the native
    kernels); debug otherwise."""
    if requested not in BACKENDS:
        raise ValueError(f"graph backend {requested!r} is unknown; allowed: {', '.join(BACKENDS)}")
    if requested == "auto":
        if debug:
            requested = "debug"
        elif device.type == "cuda":
            requested = "cuda"
        else:
            requested = "native" if device.type == "cpu" and tapeable else "debug"
    if requested == "cuda":
        if device.type != "cuda":
            raise ValueError(f"the cuda graph backend needs a CUDA/ROCm device, not {device}")
        return CudaGraphBackend(device)
    if requested == "native":
        if device.type != "cpu" or not tapeable:
            raise ValueError("the native graph backend replays the native CPU kernels: it "
                             f"needs a CPU run whose kernel table chose them (device {device})")
        return NativeGraphBackend()
    return DebugGraphBackend()


@dataclass(eq=False)
class CudaSegment:
    graph: torch.cuda.CUDAGraph

    def replay(self) -> None:
        self.graph.replay()


class CudaGraphBackend:
    name = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device=device)

    @contextmanager
    def capturing(self) -> Iterator[None]:
        # The legacy default stream cannot be captured: capture on a side stream.
        current = torch.cuda.current_stream(self.device)
        torch.cuda.synchronize(self.device)
        self.stream.wait_stream(current)
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            current.wait_stream(self.stream)
            torch.cuda.synchronize(self.device)

    def _begin(self) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        try:
            graph.capture_begin(pool=self.pool)
        except RuntimeError:
            self._recover()
            raise
        return graph

    def _abandon(self, graph: torch.cuda.CUDAGraph) -> None:
        """End a capture that raised; CUDA reports the invalidated capture, which is expected."""
        try:
            graph.capture_end()
        except RuntimeError:
            self._recover()

    def _recover(self) -> None:
        """Undo what a capture that failed half-way leaves behind, so that the next capture
        (and every random op) works: torch raised before the RNG's capture epilogue and before
        the allocator stopped recording into the pool."""
        # The generator is left "capturing": later random ops (sampling) would fail with
        # "Offset increment outside graph capture". A clone of its state (same seed and
        # offset) is not capturing.
        generator = torch.cuda.default_generators[self.device.index or 0]
        generator.graphsafe_set_state(generator.clone_state())
        # The pool stays marked as being recorded into ("beginAllocateToPool: already
        # recording"), which would fail every later capture: they take a new pool.
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: SegmentFn) -> tuple[Segment, Outputs]:
        graph = self._begin()
        try:
            outputs = as_outputs(fn())
        except BaseException:
            self._abandon(graph)
            raise
        graph.capture_end()
        return CudaSegment(graph), outputs

    def capture_breakable(self, fn: SegmentFn) -> Program:
        steps: list[Segment | AttentionBreak] = []
        graph = self._begin()

        def split(
            layer: AttentionLayer, q: torch.Tensor, metadata: AttentionMetadata
        ) -> torch.Tensor:
            nonlocal graph
            graph.capture_end()
            steps.append(CudaSegment(graph))
            # Allocated between captures: outside the pool, never reused by a segment.
            brk = AttentionBreak(layer, q, layer.empty_output(q))
            brk.run(metadata)
            steps.append(brk)
            graph = self._begin()
            return brk.out

        try:
            with attention_split(split):
                outputs = as_outputs(fn())
        except BaseException:
            self._abandon(graph)
            raise
        graph.capture_end()
        steps.append(CudaSegment(graph))
        return SegmentedProgram(steps, outputs)


@dataclass(eq=False)
class DebugSegment:
    fn: SegmentFn
    outputs: Outputs

    def replay(self) -> None:
        for static, fresh in zip(self.outputs, as_outputs(self.fn()), strict=True):
            static.copy_(fresh)


@dataclass(eq=False)
class DebugBreakableProgram:
    """Replays the whole forward with every split point routed to its recorded break.

    The code between two breaks is one segment; the breaks' static ``q``/``out``
    carry the data across, as the cuda program's do.
    """

    fn: SegmentFn
    steps: list[AttentionBreak]
    outputs: Outputs

    @property
    def segments(self) -> int:
        return len(self.steps) + 1

    @property
    def breaks(self) -> int:
        return len(self.steps)

    def replay(self, metadata: AttentionMetadata) -> Outputs:
        pending = iter(self.steps)

        def split(layer: AttentionLayer, q: torch.Tensor, _: AttentionMetadata) -> torch.Tensor:
            brk = next(pending, None)
            if brk is None or brk.layer is not layer:
                raise CaptureError(
                    f"replay reached attention layer {layer.layer_index} where capture had "
                    f"{'no break' if brk is None else f'layer {brk.layer.layer_index}'}"
                )
            brk.q.copy_(q)
            return brk.run(metadata)

        with attention_split(split):
            DebugSegment(self.fn, self.outputs).replay()
        if next(pending, None) is not None:
            raise CaptureError("replay ended before every break recorded at capture was reached")
        return self.outputs


class DebugGraphBackend:
    name = "debug"

    def capturing(self) -> AbstractContextManager[None]:
        return nullcontext()

    def capture(self, fn: SegmentFn) -> tuple[Segment, Outputs]:
        outputs = as_outputs(fn())
        return DebugSegment(fn, outputs), outputs

    def capture_breakable(self, fn: SegmentFn) -> Program:
        steps: list[AttentionBreak] = []

        def split(
            layer: AttentionLayer, q: torch.Tensor, metadata: AttentionMetadata
        ) -> torch.Tensor:
            brk = AttentionBreak(layer, torch.empty_like(q), layer.empty_output(q))
            brk.q.copy_(q)
            steps.append(brk)
            return brk.run(metadata)

        with attention_split(split):
            outputs = as_outputs(fn())
        return DebugBreakableProgram(fn, steps, outputs)


@dataclass(eq=False)
class NativeSegment:
    tape: Tape

    def replay(self) -> None:
        self.tape.replay()


class NativeGraphBackend:
    name = "native"

    def __init__(self) -> None:
        # Imported here: a build without the native kernels never selects this backend.
        from interlock.kernels.native import tape

        self._tape = tape

    def capturing(self) -> AbstractContextManager[None]:
        return nullcontext()

    @contextmanager
    def _taping(self) -> Iterator[None]:
        try:
            yield
        except self._tape.TapeError as exc:
            raise CaptureError(str(exc)) from exc

    def capture(self, fn: SegmentFn) -> tuple[Segment, Outputs]:
        with self._taping(), self._tape.recording() as tape:
            outputs = as_outputs(fn())
        return NativeSegment(tape), outputs

    def capture_breakable(self, fn: SegmentFn) -> Program:
        steps: list[Segment | AttentionBreak] = []

        def split(
            layer: AttentionLayer, q: torch.Tensor, metadata: AttentionMetadata
        ) -> torch.Tensor:
            steps.append(NativeSegment(self._tape.stop()))
            brk = AttentionBreak(layer, q, layer.empty_output(q))
            brk.run(metadata)
            steps.append(brk)
            self._tape.start()
            return brk.out

        with self._taping():
            self._tape.start()
            try:
                with attention_split(split):
                    outputs = as_outputs(fn())
            except BaseException:
                if self._tape.ACTIVE is not None:  # not stopped between two segments
                    self._tape.stop()
                raise
            steps.append(NativeSegment(self._tape.stop()))
        return SegmentedProgram(steps, outputs)
