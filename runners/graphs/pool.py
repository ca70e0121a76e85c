"""The native backend's programs share one buffer for their activations.

A native tape keeps alive every tensor its records name, so each captured program held its
own activations for every layer at once (SmolLM2 at 16 sequences, full and piecewise
programs for five sizes: ~80 MB). The cuda backend's graphs share one memory pool, which
holds because a runner replays one program at a time and reads its outputs before the
next; the native programs now do the same.

For each program, every storage allocated while its tapes recorded (``Tape.born``) and
still named by a record, a break or the program's outputs is given its lifetime: from the
first to the last step that names it (records in order, a break's ``q`` and ``out`` at its
place; the outputs stay live to the end, as the runner reads them after a replay). Those
storages are laid out in one buffer, each at the lowest 64-byte-aligned offset where no
storage alive at an overlapping step lies (two storages named by one record never share
bytes), and the buffer is shared by every program: its size is the largest program's. The
records are rewritten to the new addresses (``Tape.relocate``) and the breaks' and outputs'
tensors become views of the buffer; the old storages are freed. A program with a foreign
call (a Python call on a tape: its arguments may hold buffers the records do not show)
keeps its own, and the report says so.

Each program moves into the buffer as soon as it is captured (``SharedBuffers.add``), so the
capture holds the buffer and one program's activations at a time, not every program's
(SmolLM2 at 16 sequences: a peak of ~80 MB above the loaded model before). The manager
captures the largest key first, so the first program usually sizes the buffer; a later one
that needs more (a piecewise program can outgrow a full one of the same size) gets a larger
buffer, and the programs already in the old one move into it at the same offsets.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from interlock.runners.graphs.backends import NativeSegment
from interlock.runners.graphs.plan import GraphKey
from interlock.runners.graphs.segments import AttentionBreak, Program, SegmentedProgram

ALIGN = 64


@dataclass(frozen=True)
class Lifetime:
    start: int  # the storage's address
    nbytes: int
    first: int  # the first step naming it
    last: int  # the last


@dataclass(frozen=True)
class PoolReport:
    """What sharing did: the buffer's size, what the programs' activations took before,
    and each program that keeps its own (with why)."""

    shared_bytes: int = 0
    separate_bytes: int = 0
    programs: int = 0
    own: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        """``activations: one buffer of 21.3 MB shared by 10 programs (80.4 MB apart)``."""
        text = (f"activations: one buffer of {self.shared_bytes / 1e6:.1f} MB shared by "
                f"{self.programs} program(s) ({self.separate_bytes / 1e6:.1f} MB apart)")
        return text + "".join(f"; {key} keeps its own: {why}" for key, why in self.own.items())


class SharedBuffers:
    """The buffer the native programs' activations move into, one program at a time."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._programs: list[SegmentedProgram] = []
        self._separate = 0
        self._own: dict[str, str] = {}

    def add(self, key: GraphKey, program: Program) -> None:
        """Move ``program``'s activations into the buffer (grown first where it needs more
        room), or record why it keeps its own."""
        why = _unshareable(program)
        if why is not None:
            self._own[key.label] = why
            return
        assert isinstance(program, SegmentedProgram)
        lifetimes = _lifetimes(program)
        placed, size = _place(lifetimes)
        if self._buffer is None or size > self._buffer.numel():
            self._grow(size)
        assert self._buffer is not None
        _relocate(program, {life.start: (offset, life.nbytes)
                            for life, offset in zip(lifetimes, placed, strict=True)},
                  self._buffer)
        self._programs.append(program)
        self._separate += sum(life.nbytes for life in lifetimes)

    def _grow(self, size: int) -> None:
        """A buffer of ``size`` bytes, the programs in the old one moved to the same offsets
        (the old one is freed when the last of them lets go of it)."""
        old, self._buffer = self._buffer, torch.empty(size, dtype=torch.uint8)
        if old is not None:
            whole = {old.data_ptr(): (0, old.numel())}
            for program in self._programs:
                _relocate(program, whole, self._buffer)

    def report(self) -> PoolReport:
        size = 0 if self._buffer is None else self._buffer.numel()
        return PoolReport(size, self._separate, len(self._programs), dict(self._own))


def _unshareable(program: Program) -> str | None:
    if not isinstance(program, SegmentedProgram):
        return f"a {type(program).__name__} is not a sequence of native segments"
    for step in program.steps:
        if isinstance(step, AttentionBreak):
            continue
        if not isinstance(step, NativeSegment):
            return f"its segments are {type(step).__name__}, not native tapes"
        if step.tape.foreign_calls:
            return "a foreign call on its tape may hold buffers its records do not show"
    return None


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _owner(starts: list[int], nbytes: Mapping[int, int], address: int) -> int | None:
    """The storage (of ``starts``, sorted, each ``nbytes[start]`` long) holding ``address``."""
    at = bisect.bisect_right(starts, address) - 1
    if at >= 0 and address < starts[at] + nbytes[starts[at]]:
        return starts[at]
    return None


def _lifetimes(program: SegmentedProgram) -> list[Lifetime]:
    """Each storage of the program's own (born while it recorded, still named), with the
    steps it is alive over."""
    tapes = [step.tape for step in program.steps if isinstance(step, NativeSegment)]
    named = set().union(*(tape.kept_storages() for tape in tapes))
    named |= {_storage(t) for step in program.steps if isinstance(step, AttentionBreak)
              for t in (step.q, step.out)}
    named |= {_storage(t) for t in program.outputs}
    # The live storages are disjoint; a storage born and freed during the recording (never
    # named) may share an address with a later one, and is left out.
    born = dict(b for tape in tapes for b in tape.born if b[0] in named)
    starts = sorted(born)
    span: dict[int, list[int]] = {}

    def touch(address: int, step: int) -> None:
        start = _owner(starts, born, address)
        if start is not None:
            span.setdefault(start, [step, step])[1] = step

    step = 0
    for part in program.steps:
        if isinstance(part, AttentionBreak):
            touch(part.q.data_ptr(), step)
            touch(part.out.data_ptr(), step)
            step += 1
            continue
        assert isinstance(part, NativeSegment)
        for slots in part.tape.address_slots():
            for value in slots:
                touch(value, step)
            step += 1
    for t in program.outputs:
        touch(t.data_ptr(), step)
    return [Lifetime(start, born[start], first, last)
            for start, (first, last) in sorted(span.items())]


def _place(lifetimes: list[Lifetime]) -> tuple[list[int], int]:
    """Each storage's offset in the buffer (largest first, lowest fit), and its size."""
    order = sorted(range(len(lifetimes)), key=lambda i: -lifetimes[i].nbytes)
    offsets = [0] * len(lifetimes)
    placed: list[int] = []
    size = 0
    for i in order:
        life = lifetimes[i]
        taken = sorted(
            (offsets[j], offsets[j] + lifetimes[j].nbytes) for j in placed
            if lifetimes[j].first <= life.last and life.first <= lifetimes[j].last
        )
        offset = 0
        for lo, hi in taken:
            if offset + life.nbytes <= lo:
                break
            offset = max(offset, -(-hi // ALIGN) * ALIGN)
        offsets[i] = offset
        placed.append(i)
        size = max(size, offset + life.nbytes)
    return offsets, size


def _relocate(program: SegmentedProgram, offsets: dict[int, tuple[int, int]],
              buffer: torch.Tensor) -> None:
    base = buffer.data_ptr()
    starts = sorted(offsets)
    sizes = {start: nbytes for start, (_, nbytes) in offsets.items()}

    def move(address: int) -> int:
        start = _owner(starts, sizes, address)
        return address if start is None else base + offsets[start][0] + address - start

    def view(t: torch.Tensor) -> torch.Tensor:
        if _storage(t) not in offsets:
            return t
        at = move(t.data_ptr()) - base
        return torch.empty(0, dtype=t.dtype).set_(
            buffer.untyped_storage(), at // t.element_size(), t.shape, t.stride())

    moved = set(offsets)
    for step in program.steps:
        if isinstance(step, AttentionBreak):
            step.q, step.out = view(step.q), view(step.out)
        else:
            assert isinstance(step, NativeSegment)
            step.tape.relocate(move, moved, buffer)
    program.outputs = tuple(view(t) for t in program.outputs)
