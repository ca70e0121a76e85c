"""Capture sizes, the mode table, and the two runners' capture plans (torch-free logic)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from interlock.core.decision import CUDAGRAPH_MODES
from interlock.runners.graphs.modes import Strategy, strategy_for
from interlock.runners.graphs.sizes import CaptureSizes, auto_capture_sizes
from interlock.runners.mrv1.graphs import MRV1Plan
from interlock.runners.mrv2.graphs import MRV2Plan

E, F, P, B = Strategy.EAGER, Strategy.FULL, Strategy.PIECEWISE, Strategy.BREAKABLE


def test_auto_sizes_are_powers_of_two_then_steps_of_eight_up_to_the_max():
    assert auto_capture_sizes(1) == (1,)
    assert auto_capture_sizes(6) == (1, 2, 4, 6)
    assert auto_capture_sizes(30) == (1, 2, 4, 8, 16, 24, 30)
    assert auto_capture_sizes(64)[-3:] == (48, 56, 64)


def test_chosen_sizes_drop_what_no_batch_can_reach_and_pad_up():
    sizes = CaptureSizes.choose([8, 2, 4, 100], limit=16)
    assert sizes.sizes == (2, 4, 8) and sizes.dropped == (100,)
    assert [sizes.pad(n) for n in (1, 2, 3, 8, 9)] == [2, 2, 4, 8, None]
    with pytest.raises(ValueError, match=r"capture sizes \[0\] are invalid"):
        CaptureSizes.choose([0, 2], limit=4)


# (mode, breakable) -> (strategy of a decode batch, of a mixed batch)
MODE_TABLE = {
    ("none", False): (E, E),
    ("none", True): (E, E),
    ("piecewise", False): (P, P),
    ("piecewise", True): (B, B),
    ("full", False): (F, F),
    ("full", True): (B, B),
    ("full_decode_only", False): (F, E),
    ("full_decode_only", True): (B, E),
    ("full_and_piecewise", False): (F, P),
    ("full_and_piecewise", True): (B, B),
}


@pytest.mark.parametrize(("mode", "breakable"), MODE_TABLE)
def test_every_mode_with_and_without_breakable(mode, breakable):
    decode, mixed = MODE_TABLE[mode, breakable]
    assert strategy_for(mode, breakable, decode_only=True) is decode
    assert strategy_for(mode, breakable, decode_only=False) is mixed


def plans(mode: str, breakable: bool, sizes: tuple[int, ...]):
    chosen = CaptureSizes.choose(sizes, limit=32)
    return [
        MRV1Plan(mode, breakable, chosen),
        MRV2Plan(mode, breakable, chosen, max_num_seqs=6, max_num_batched_tokens=32),
    ]


@given(
    mode=st.sampled_from(CUDAGRAPH_MODES),
    breakable=st.booleans(),
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=5, unique=True).map(tuple),
    seqs=st.integers(1, 6),
    extra=st.integers(0, 30),
    decode_only=st.booleans(),
)
def test_routes_pad_up_to_a_captured_key_or_say_why_not(
    mode, breakable, sizes, seqs, extra, decode_only
):
    tokens = seqs if decode_only else seqs + extra
    for plan in plans(mode, breakable, sizes):
        order = plan.capture_order()
        assert len(order) == len(set(order))
        route = plan.route(tokens, seqs, decode_only)
        if route.key is None:
            assert route.reason
            continue
        key = route.key
        assert key in order
        assert key.tokens >= tokens and key.seqs >= seqs
        assert key.strategy is strategy_for(mode, breakable, decode_only)
        # Full graphs bake attention in, so they are specific to the batch kind.
        assert key.batch == (("decode" if decode_only else "mixed") if key.strategy is F else "any")


def test_mrv1_pads_tokens_and_sequences_to_one_size_largest_first():
    plan = MRV1Plan("full_and_piecewise", False, CaptureSizes.choose((1, 2, 4), limit=32))
    labels = [k.label for k in plan.capture_order()]
    assert labels == [
        "full/decode/4t4s", "piecewise/any/4t4s", "full/decode/2t2s", "piecewise/any/2t2s",
        "full/decode/1t1s", "piecewise/any/1t1s",
    ]
    assert plan.route(3, 2, False).key.label == "piecewise/any/4t4s"
    assert plan.route(5, 5, True).reason == "batch of 5 tokens above the largest capture size 4"


def test_mrv2_keys_decode_by_requests_and_mixed_by_tokens_decode_first():
    plan = MRV2Plan("full", False, CaptureSizes.choose((2, 8), limit=32), 4, 32)
    assert [k.label for k in plan.capture_order()] == [
        "full/decode/2t2s", "full/mixed/8t4s", "full/mixed/2t2s",
    ]
    assert plan.route(7, 3, False).key.label == "full/mixed/8t4s"
    assert plan.route(3, 3, True).reason == (
        "decode batch of 3 requests above the largest capture size 2"
    )
    assert plan.sizes()["decode_requests"].dropped == (8,)


def test_none_captures_nothing_and_says_breakable_has_nothing_to_cut():
    for plan in plans("none", True, (1, 2)):
        assert plan.capture_order() == []
        assert plan.route(1, 1, True).reason == "cudagraph=none (breakable has nothing to cut)"
