"""A runner's graphs: capture every key of its plan, route each batch, count what ran how."""

from __future__ import annotations

import time
from collections import Counter

import torch

from interlock.runners.graphs.backends import GraphBackend, NativeGraphBackend, select_backend
from interlock.runners.graphs.buffers import ForwardInputs, StaticInputs
from interlock.runners.graphs.capture import ForcedFailures, capture_program
from interlock.runners.graphs.plan import CapturePlan, GraphKey
from interlock.runners.graphs.pool import SharedBuffers
from interlock.runners.graphs.report import CapturedGraph, GraphReport
from interlock.runners.graphs.segments import Program
from interlock.runners.model.decoder import CausalLM


class GraphManager:
    """Owns the backend, the static inputs and the captured programs of one runner."""

    def __init__(
        self,
        plan: CapturePlan,
        device: torch.device,
        backend: str,
        table_width: int,
        *,
        compile: bool = False,
        tapeable: bool = False,
        debug: bool = False,
        forced: ForcedFailures | None = None,
    ) -> None:
        self.plan = plan
        #: The captures made to fail (``ModelSpec.fail_capture``), to test the fallback.
        self.forced = forced or ForcedFailures()
        self.compile = compile
        self.order = plan.capture_order()
        self.backend: GraphBackend | None = None
        self.static: StaticInputs | None = None
        if self.order:
            self.backend = select_backend(backend, device, tapeable, debug=debug)
            self.static = StaticInputs(
                max(k.tokens for k in self.order), max(k.seqs for k in self.order),
                table_width, device,
            )
        self.programs: dict[GraphKey, Program] = {}
        self.failed: dict[GraphKey, str] = {}
        self.capture_s = 0.0
        self.replays: Counter[str] = Counter()
        self.eager_steps: Counter[str] = Counter()
        self._views: dict[tuple[GraphKey, bool], ForwardInputs] = {}
        self.split_points: tuple[str, ...] = ()  # each attention split point, in order
        self.buffers = ""  # where the programs' activations live (the native pool's line)

    def capture(self, model: CausalLM) -> None:
        """Capture every key, largest first; a key whose capture fails runs eagerly."""
        if self.backend is None or self.static is None:
            return
        self.split_points = tuple(layer.break_label for layer in model.attention_layers)
        start = time.perf_counter()
        # the native programs' activations move into one buffer as each is captured
        pool = SharedBuffers() if isinstance(self.backend, NativeGraphBackend) else None
        for key in self.order:
            self.static.fill_padding(key.tokens, key.seqs)
            inputs = self.inputs(key, key.capture_decode_only)
            try:
                self.programs[key] = capture_program(
                    self.backend, key, model, inputs, fail=self.forced.applies(key),
                    compile=self.compile,
                )
            # CaptureError, ops CUDA cannot capture, out of memory, torch.compile failures.
            except RuntimeError as exc:
                self.failed[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                continue
            if pool is not None:
                pool.add(key, self.programs[key])
        if pool is not None:
            self.buffers = pool.report().line()
        self.capture_s = time.perf_counter() - start

    def inputs(self, key: GraphKey, decode_only: bool) -> ForwardInputs:
        """The static views ``key`` reads, for a batch of the given kind."""
        view = self._views.get((key, decode_only))
        if view is None:
            assert self.static is not None
            view = self._views[key, decode_only] = self.static.view(
                key.tokens, key.seqs, decode_only
            )
        return view

    def select(
        self, num_tokens: int, num_seqs: int, decode_only: bool
    ) -> tuple[GraphKey, Program] | None:
        """The key and program that serve this batch, or None (counted with its reason)."""
        route = self.plan.route(num_tokens, num_seqs, decode_only)
        if route.key is None:
            self.eager_steps[route.reason] += 1
            return None
        program = self.programs.get(route.key)
        if program is None:
            self.eager_steps[f"capture of {route.key.label} failed"] += 1
            return None
        self.replays[route.key.label] += 1
        return route.key, program

    def fallbacks(self) -> tuple[str, ...]:
        return tuple(
            f"{key.label}: capture failed ({why}); batches of this size run eagerly"
            for key, why in self.failed.items()
        )

    def report(self) -> GraphReport:
        ladders = self.plan.sizes()
        return GraphReport(
            backend=self.backend.name if self.backend is not None else "none",
            mode=self.plan.mode,
            breakable=self.plan.breakable,
            sizes={name: ladder.sizes for name, ladder in ladders.items()},
            dropped_sizes=tuple(sorted({s for ladder in ladders.values() for s in ladder.dropped})),
            captured=tuple(
                CapturedGraph(
                    key.label, key.strategy.value, key.batch, key.tokens, key.seqs,
                    program.segments, program.breaks,
                )
                for key, program in self.programs.items()
            ),
            failed={key.label: why for key, why in self.failed.items()},
            break_points=(self.split_points
                          if any(p.breaks for p in self.programs.values()) else ()),
            capture_s=self.capture_s,
            buffers=self.buffers,
            replays=dict(self.replays),
            eager_steps=dict(self.eager_steps),
        )
