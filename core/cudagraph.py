"""What each cudagraph mode means: the graph it captures for each kind of batch, and the
mode stage 5 tries when a runner does not serve it.

The one table of it: the decision's fallback chain (``interlock.core.decision``), the
runners' per-batch strategy (``interlock.runners.graphs.modes``) and what vLLM runs a
mode as without piecewise graphs (``interlock.vllm.command``) are all read from
:data:`MODES`. A batch is ``decode`` (every sequence decodes one token) or ``mixed``
(some prefill); each gets a ``full`` graph (the whole forward, attention included), a
``piecewise`` one (split at attention before capture, attention eager between the
pieces) or none (eager).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

CudagraphMode = Literal["none", "piecewise", "full", "full_decode_only", "full_and_piecewise"]
CUDAGRAPH_MODES: tuple[CudagraphMode, ...] = get_args(CudagraphMode)
#: The graph a batch is captured as; None: it runs eagerly.
Graph = Literal["full", "piecewise"] | None


@dataclass(frozen=True)
class ModeMeaning:
    decode: Graph  # a decode-only batch
    mixed: Graph  # a batch with prefill
    #: What stage 5 tries when a runner does not serve this mode (None: every runner
    #: serves it; every chain ends there).
    fallback: str | None


MODES: Mapping[str, ModeMeaning] = {
    "none": ModeMeaning(decode=None, mixed=None, fallback=None),
    "piecewise": ModeMeaning(decode="piecewise", mixed="piecewise", fallback="none"),
    "full": ModeMeaning(decode="full", mixed="full", fallback="none"),
    "full_decode_only": ModeMeaning(decode="full", mixed=None, fallback="none"),
    "full_and_piecewise": ModeMeaning(decode="full", mixed="piecewise", fallback="piecewise"),
}
if tuple(MODES) != CUDAGRAPH_MODES:  # the Literal is what annotations and schemas read
    raise AssertionError(f"MODES {tuple(MODES)} differs from CudagraphMode {CUDAGRAPH_MODES}")


def graph_for(mode: str, decode_only: bool) -> Graph:
    """The graph a batch (pure decode or with prefill) is captured as under ``mode``."""
    meaning = MODES.get(mode)
    if meaning is None:
        raise ValueError(f"cudagraph {mode!r} is not a mode; allowed: {', '.join(MODES)}")
    return meaning.decode if decode_only else meaning.mixed


def fallbacks() -> dict[str, str]:
    """Mode -> the mode stage 5 tries next, for the modes that have one."""
    return {mode: m.fallback for mode, m in MODES.items() if m.fallback is not None}


def without_piecewise(mode: str) -> str:
    """The mode that captures what ``mode`` does with its piecewise graphs left out (those
    batches run eagerly): where piecewise capture is impossible, ``mode`` runs as this."""
    meaning = MODES[mode]

    def drop(graph: Graph) -> Graph:
        return None if graph == "piecewise" else graph

    wanted = (drop(meaning.decode), drop(meaning.mixed))
    return next(name for name, m in MODES.items() if (m.decode, m.mixed) == wanted)
