"""What each cudagraph mode, with and without breakable capture, does with a batch.

One table shared by every runner, so ``full_decode_only`` means the same
thing in mrv1 and mrv2. A batch runs with one of four strategies:

==========  ==============================================================
eager       no graph
full        the whole forward (attention included) is one graph
piecewise   the forward split at attention *before* capture (planned
            pieces); one graph per piece, attention eager between them
breakable   the whole forward captured as one program whose breaks are
            found *during* capture: each attention ends the current graph
            segment, runs eagerly, and a new segment starts
==========  ==============================================================

``breakable`` decides how a graph that would span attention is cut: every
graph of the mode is captured as a breakable program instead (full graphs and
planned pieces alike), so attention always runs eagerly between segments and
no ``torch.compile`` is involved. With ``cudagraph=none`` there is nothing to
cut: breakable has no effect.
"""

from __future__ import annotations

from enum import Enum

from interlock.core.cudagraph import MODES, graph_for


class Strategy(str, Enum):
    EAGER = "eager"
    FULL = "full"
    PIECEWISE = "piecewise"
    BREAKABLE = "breakable"


def strategy_for(mode: str, breakable: bool, decode_only: bool) -> Strategy:
    """How a batch (pure decode or mixed prefill/decode) runs under ``mode``: the graph the
    mode's table gives it (``interlock.core.cudagraph``), cut during capture if breakable."""
    graph = graph_for(mode, decode_only)
    if graph is None:
        return Strategy.EAGER
    if breakable:
        return Strategy.BREAKABLE
    return Strategy.PIECEWISE if graph == "piecewise" else Strategy.FULL


def eager_reason(mode: str, breakable: bool) -> str:
    """Why a batch that ``strategy_for`` sends to eager runs without a graph."""
    if MODES[mode].decode is None:  # nothing captured at all
        suffix = " (breakable has nothing to cut)" if breakable else ""
        return f"cudagraph={mode}{suffix}"
    return f"mixed prefill/decode batch under cudagraph={mode}"
