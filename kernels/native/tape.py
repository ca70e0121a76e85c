"""Tapes: the native kernel calls of a forward, recorded once and replayed without Python.

The native ops take addresses, so a call is fully described by its arguments. While a
tape records (``recording``), every native op appends its call to the tape as it runs,
and the tape keeps each tensor the call named alive; ``Tape.replay`` then runs the whole
sequence in one C call, reading whatever the named buffers hold by then. It is the CPU's
counterpart of a CUDA graph, and the native graph backend's segment.

Ops of other backends that run while recording (the MoE ops, a plugin's kernels: a kernel
table wraps them with ``foreign``; torch's product for a weight that is not packed: native
``linear`` calls it so; a tensor-parallel group's collectives) are recorded as Python
calls: a replay runs the native records between them in C, calls them again on the same
buffers and copies what they return over what they returned at capture. Any other torch
op that computes (not a view, not an allocation) while recording raises ``TapeError``
naming it: a replay would miss it.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from interlock.kernels.native import _cpu
from interlock.kernels.native.threads import follow_torch_threads

#: The tape now recording, if any (a forward records on one thread).
ACTIVE: Tape | None = None

# Ops that only make views or allocate: they compute nothing a replay would miss.
_METADATA_OPS = frozenset({
    "view", "_unsafe_view", "split", "split_with_sizes", "slice", "select", "t",
    "transpose", "permute", "as_strided", "alias", "detach", "expand", "unsqueeze",
    "squeeze", "unbind", "narrow", "chunk", "empty", "empty_strided", "empty_like",
})


_ALLOCATIONS = frozenset({"empty", "empty_strided", "empty_like"})


class TapeError(RuntimeError):
    """A forward did something a tape cannot replay."""


@dataclass(eq=False)
class ForeignCall:
    """A call of another backend's op, recorded with what it returned at capture."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any

    def replay(self) -> None:
        fresh = self.fn(*self.args, **self.kwargs)
        if isinstance(self.result, torch.Tensor):
            self.result.copy_(fresh)
        elif isinstance(self.result, tuple):
            for static, new in zip(self.result, fresh, strict=True):
                static.copy_(new)


#: A record's argument slots (after its op code), each 8 bytes.
SLOTS = _cpu.MAX_SLOTS
#: Op code -> the kinds of its argument slots ("i" an int, "d" a float: _cpu.SIGNATURES).
KINDS = {getattr(_cpu, f"OP_{name.upper()}"): kinds for name, kinds in _cpu.SIGNATURES.items()}


def _int_positions(slots: array[int]) -> Iterator[list[int]]:
    """Per record of a run, where its int slots are (float slots left out: _cpu.SIGNATURES)."""
    for at in range(0, len(slots), 1 + SLOTS):
        yield [at + 1 + j for j, kind in enumerate(KINDS[slots[at]]) if kind == "i"]


class Tape:
    """Recorded native calls (and foreign ones), and the tensors they read and write."""

    def __init__(self) -> None:
        self._records: list[bytes] = []  # native records since the last foreign call
        self._steps: list[bytes | ForeignCall] = []
        self._keep: list[torch.Tensor] = []
        self.calls = 0  # native calls recorded
        #: (address, bytes) of each storage allocated while it recorded: its own buffers,
        #: which nothing outside the forward holds (``runners.graphs.pool`` shares them)
        self.born: list[tuple[int, int]] = []

    def add(self, op: int, args: tuple[int | float, ...], tensors: tuple[torch.Tensor, ...]
            ) -> None:
        self._records.append(_cpu.record(op, *args))
        self._keep.extend(tensors)
        self.calls += 1

    def add_foreign(self, call: ForeignCall) -> None:
        self._flush()
        self._steps.append(call)

    def _flush(self) -> None:
        if self._records:
            self._steps.append(b"".join(self._records))
            self._records = []

    def seal(self) -> None:
        self._flush()

    @property
    def foreign_calls(self) -> int:
        return sum(isinstance(step, ForeignCall) for step in self._steps)

    def kept_storages(self) -> set[int]:
        """The addresses of the storages the tape keeps alive (every one a record names)."""
        return {t.untyped_storage().data_ptr() for t in self._keep}

    def _native_runs(self) -> Iterator[array[int]]:
        """Each run of native records as its slots (a tape without foreign calls)."""
        for step in self._steps:
            if not isinstance(step, bytes):
                raise TapeError("a tape with foreign calls has no addresses of its own")
            yield array("q", step)

    def address_slots(self) -> Iterator[list[int]]:
        """Each native record's int slots (addresses among them), in order (a tape without
        foreign calls)."""
        for slots in self._native_runs():
            for ints in _int_positions(slots):
                yield [slots[at] for at in ints]

    def relocate(self, move: Callable[[int], int], moved: set[int], buffer: torch.Tensor
                 ) -> None:
        """Rewrite every int slot through ``move`` (an address into a storage of ``moved``
        becomes one into ``buffer``; anything else unchanged); the tape then keeps
        ``buffer`` instead of the moved storages."""
        steps: list[bytes | ForeignCall] = []
        for slots in self._native_runs():
            for ints in _int_positions(slots):
                for at in ints:
                    slots[at] = move(slots[at])
            steps.append(slots.tobytes())
        self._steps = steps
        self._keep = [t for t in self._keep if t.untyped_storage().data_ptr() not in moved]
        self._keep.append(buffer)

    def replay(self) -> None:
        follow_torch_threads()
        for step in self._steps:
            if isinstance(step, bytes):
                _cpu.run_tape(step)
            else:
                step.replay()


class _NativeOnly(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # The default wraps __torch_dispatch__ to keep torch.compile out of it, which
        # imports torch._dynamo (~2 s, most of a model load) the first time a mode is used;
        # nothing here is ever compiled.
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        name = func.overloadpacket.__name__
        if name not in _METADATA_OPS and name != "reshape":
            raise TapeError(f"{func} ran while a native tape was recording, and a tape "
                            "replays only native kernels")
        out = func(*args, **(kwargs or {}))
        if name in _ALLOCATIONS and ACTIVE is not None:
            storage = out.untyped_storage()
            ACTIVE.born.append((storage.data_ptr(), storage.nbytes()))
        # reshape is a view when the strides allow one, else a copy a replay would miss.
        if name == "reshape" and (out.untyped_storage().data_ptr()
                                  != args[0].untyped_storage().data_ptr()):
            raise TapeError(f"{func} copied while a native tape was recording, and a tape "
                            "replays only native kernels")
        return out


_GUARD: _NativeOnly | None = None


def start() -> Tape:
    """Start recording a new tape (``stop`` ends it)."""
    global ACTIVE, _GUARD
    if ACTIVE is not None:
        raise TapeError("a native tape is already recording")
    ACTIVE, _GUARD = Tape(), _NativeOnly()
    _GUARD.__enter__()
    return ACTIVE


def stop() -> Tape:
    """Stop recording; the tape is sealed, ready to replay."""
    global ACTIVE, _GUARD
    tape, guard = ACTIVE, _GUARD
    if tape is None or guard is None:
        raise TapeError("no native tape is recording")
    ACTIVE = _GUARD = None
    guard.__exit__(None, None, None)
    tape.seal()
    return tape


@contextmanager
def recording() -> Iterator[Tape]:
    """Record the native calls of the block into a tape (sealed when the block ends)."""
    tape = start()
    try:
        yield tape
    finally:
        stop()


def foreign(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (another backend's op), recorded as a Python call when it runs while a tape
    records; called as it is otherwise."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        global ACTIVE, _GUARD
        recorder = ACTIVE
        if recorder is None:
            return fn(*args, **kwargs)
        assert _GUARD is not None  # recording: start() entered it
        _GUARD.__exit__(None, None, None)
        # The call runs as it will at each replay: native ops inside it (a collective's
        # embedding lookup) belong to it, not to the tape, and a foreign call inside it is
        # just a call.
        ACTIVE = None
        try:
            result = fn(*args, **kwargs)
        finally:
            ACTIVE = recorder
            _GUARD = _NativeOnly()
            _GUARD.__enter__()
        recorder.add_foreign(ForeignCall(fn, args, kwargs, result))
        return result

    return call
