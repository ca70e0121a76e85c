"""The cudagraph modes' meaning is one table (interlock.core.cudagraph): the decision's
fallback chain, the runners' per-batch strategy and the vLLM command's lowering read it."""

from __future__ import annotations

import pytest

from interlock.core.cudagraph import CUDAGRAPH_MODES, MODES, graph_for, without_piecewise
from interlock.core.decision import FIELDS
from interlock.runners.graphs.modes import Strategy, eager_reason, strategy_for


def test_the_decision_falls_back_along_the_table() -> None:
    assert dict(FIELDS["cudagraph"].fallback) == {
        "piecewise": "none", "full": "none", "full_decode_only": "none",
        "full_and_piecewise": "piecewise",
    }
    assert FIELDS["cudagraph"].choices == CUDAGRAPH_MODES == tuple(MODES)


@pytest.mark.parametrize("mode", CUDAGRAPH_MODES)
@pytest.mark.parametrize("decode_only", [True, False])
def test_the_runners_strategy_is_the_tables_graph(mode: str, decode_only: bool) -> None:
    graph = graph_for(mode, decode_only)
    expected = {None: Strategy.EAGER, "full": Strategy.FULL, "piecewise": Strategy.PIECEWISE}
    assert strategy_for(mode, False, decode_only) == expected[graph]
    breakable = Strategy.EAGER if graph is None else Strategy.BREAKABLE
    assert strategy_for(mode, True, decode_only) == breakable


def test_the_known_meanings() -> None:
    assert [graph_for("full_and_piecewise", d) for d in (True, False)] == ["full", "piecewise"]
    assert [graph_for("full_decode_only", d) for d in (True, False)] == ["full", None]
    assert eager_reason("full_decode_only", False) == (
        "mixed prefill/decode batch under cudagraph=full_decode_only"
    )
    assert eager_reason("none", True) == "cudagraph=none (breakable has nothing to cut)"
    with pytest.raises(ValueError, match="cudagraph 'partial' is not a mode; allowed: none"):
        strategy_for("partial", False, True)


@pytest.mark.parametrize("mode", CUDAGRAPH_MODES)
def test_vllm_without_compile_runs_the_mode_without_its_piecewise_graphs(mode: str) -> None:
    lowered = without_piecewise(mode)
    for decode_only in (True, False):
        graph = graph_for(mode, decode_only)
        assert graph_for(lowered, decode_only) == (None if graph == "piecewise" else graph)
    known = {"full_and_piecewise": "full_decode_only", "piecewise": "none"}
    assert known.get(mode, mode) == lowered
