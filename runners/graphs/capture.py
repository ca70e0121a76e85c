"""Capturing one graph key: warm-up, then the program its strategy calls for.

* ``full``: the forward and the logits head as one segment.
* ``piecewise``: the model's planned pieces (``CausalLM.pieces``: the forward
  cut at every attention split point before capture), one segment per piece,
  with an eager :class:`AttentionBreak` after each piece but the last.
* ``breakable``: the whole forward handed to the backend, which finds the
  breaks while capturing.

Each key is warmed up first (its functions run once, uncaptured), so kernels
are compiled, workspaces allocated and, with ``compile``, ``torch.compile``
has compiled the segments before any capture starts.

``$INTERLOCK_GRAPHS_FAIL_CAPTURE`` (``all`` or capture sizes, e.g. ``4,8``)
makes the capture of matching keys raise inside the captured region, as an op
that cannot be captured would: tests use it to exercise the eager fallback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from interlock.core.env import GRAPHS_FAIL_CAPTURE
from interlock.core.errors import InputError
from interlock.runners.graphs.backends import CaptureError, GraphBackend
from interlock.runners.graphs.buffers import ForwardInputs
from interlock.runners.graphs.modes import Strategy
from interlock.runners.graphs.plan import GraphKey
from interlock.runners.graphs.segments import (
    AttentionBreak,
    Outputs,
    Program,
    Segment,
    SegmentedProgram,
    SegmentFn,
)
from interlock.runners.model.decoder import CausalLM, ForwardPiece


def logits_head(model: CausalLM, inputs: ForwardInputs) -> Callable[[torch.Tensor], torch.Tensor]:
    """hidden [T, H] -> logits [B, V] of each sequence's last fed token."""

    def head(hidden: torch.Tensor) -> torch.Tensor:
        return model.compute_logits(model.ops.select_rows(hidden, inputs.logits_indices))

    return head


def forward_logits(model: CausalLM, inputs: ForwardInputs) -> torch.Tensor:
    """The function every graph captures: the forward, then the logits head."""
    hidden = model(inputs.input_ids, inputs.positions, inputs.metadata)
    return logits_head(model, inputs)(hidden)


@dataclass(frozen=True)
class ForcedFailures:
    """Capture sizes whose capture is made to fail (for tests of the eager fallback)."""

    sizes: frozenset[int] = frozenset()
    every: bool = False

    @classmethod
    def parse(cls, given: str | None) -> ForcedFailures:
        """``ModelSpec.fail_capture`` (``$INTERLOCK_GRAPHS_FAIL_CAPTURE``, read where the run
        started); a value of another form is an error naming the variable."""
        text = (given or "").strip()
        if not text:
            return cls()
        if text == "all":
            return cls(every=True)
        try:
            sizes = frozenset(int(part) for part in text.split(","))
        except ValueError:
            raise InputError(
                f"{GRAPHS_FAIL_CAPTURE.name}={text!r} is invalid; allowed: 'all' or capture "
                "sizes like '4,8'"
            ) from None
        return cls(sizes)

    def applies(self, key: GraphKey) -> bool:
        return self.every or key.tokens in self.sizes


def capture_program(
    backend: GraphBackend,
    key: GraphKey,
    model: CausalLM,
    inputs: ForwardInputs,
    *,
    fail: bool = False,
    compile: bool = False,
) -> Program:
    """Warm up, then capture ``key``'s program over ``inputs`` (static views).

    With ``compile`` the graph segments (the full forward, or each planned
    piece) are ``torch.compile``d first; warm-up runs them, so compilation
    happens before capture. Breakable programs are never compiled.
    """
    with backend.capturing():
        if key.strategy is Strategy.PIECEWISE:
            pieces = model.pieces(inputs.input_ids, inputs.positions, inputs.metadata)
            return _capture_pieces(backend, key, pieces, inputs, logits_head(model, inputs),
                                   fail, compile)
        whole = _compiled(lambda: forward_logits(model, inputs), compile)
        whole()  # warm-up: kernels compiled and workspaces allocated outside capture
        if key.strategy is Strategy.FULL:
            segment, outputs = backend.capture(_guarded(whole, key, fail))
            return SegmentedProgram([segment], outputs)
        if key.strategy is Strategy.BREAKABLE:
            if compile:
                raise CaptureError(f"{key.label}: breakable capture runs without torch.compile")
            return backend.capture_breakable(_guarded(whole, key, fail))
    raise ValueError(f"{key.label}: strategy {key.strategy.value} captures nothing")


def _capture_pieces(
    backend: GraphBackend,
    key: GraphKey,
    pieces: Sequence[ForwardPiece],
    inputs: ForwardInputs,
    head: Callable[[torch.Tensor], torch.Tensor],
    fail: bool,
    compile: bool,
) -> Program:
    if not pieces or any(p.split is None for p in pieces[:-1]) or pieces[-1].split is not None:
        raise CaptureError(f"{key.label}: pieces must each end at an attention but the last")
    runs = [
        _compiled(_piece_step(piece, head if piece.split is None else None), compile)
        for piece in pieces
    ]
    # Warm-up: the chain once, eagerly, through the same (compiled) functions.
    attn_out = residual = None
    for piece, run in zip(pieces, runs, strict=True):
        outputs = run(attn_out, residual)
        if piece.split is not None:
            attn_out, residual = piece.split.attend(outputs[0], inputs.metadata), outputs[1]
    steps: list[Segment | AttentionBreak] = []
    attn_out = residual = None
    for index, (piece, run) in enumerate(zip(pieces, runs, strict=True)):
        bound = functools.partial(run, attn_out, residual)
        segment, outputs = backend.capture(_guarded(bound, key, fail and index == 0))
        steps.append(segment)
        if piece.split is None:
            return SegmentedProgram(steps, outputs)
        q, residual = outputs
        brk = AttentionBreak(piece.split, q, piece.split.empty_output(q))
        brk.run(inputs.metadata)
        steps.append(brk)
        attn_out = brk.out
    raise AssertionError("unreachable: the last piece returns")


def _piece_step(
    piece: ForwardPiece, head: Callable[[torch.Tensor], torch.Tensor] | None
) -> Callable[[torch.Tensor | None, torch.Tensor | None], Outputs]:
    """One piece as a function of its inputs; the last one ends with the logits head."""

    def step(attn_out: torch.Tensor | None, residual: torch.Tensor | None) -> Outputs:
        x, res = piece(attn_out, residual)
        return (head(x),) if head is not None else (x, res)

    return step


def _compiled(fn: Callable[..., Any], compile: bool) -> Callable[..., Any]:
    # Static shapes: every key has its own shapes, and its own compiled code.
    return torch.compile(fn, dynamic=False) if compile else fn


def _guarded(fn: Callable[[], torch.Tensor | Outputs], key: GraphKey, fail: bool) -> SegmentFn:
    if not fail:
        return fn

    def failing() -> Outputs:
        raise CaptureError(f"capture of {key.label} failed: forced by ${GRAPHS_FAIL_CAPTURE.name}")

    return failing
