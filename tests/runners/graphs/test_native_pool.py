"""The native programs share one buffer for their activations: laid out so that nothing
alive at once overlaps, and giving the tokens the programs gave with buffers of their own."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.kernels.native import unavailable as native_unavailable
from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.runners.graphs import pool
from interlock.runners.graphs.pool import ALIGN, Lifetime, _place

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NATIVE = pytest.mark.skipif(native_unavailable("cpu") is not None,
                            reason=f"native kernels: {native_unavailable('cpu')}")

lifetimes = st.lists(
    st.tuples(st.integers(1, 5000), st.integers(0, 40), st.integers(0, 10)).map(
        lambda t: (t[0], t[1], t[1] + t[2])),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(lifetimes)
def test_storages_alive_at_once_never_share_bytes(drawn: list[tuple[int, int, int]]) -> None:
    lives = [Lifetime(start=i, nbytes=n, first=a, last=b) for i, (n, a, b) in enumerate(drawn)]
    offsets, size = _place(lives)
    assert all(offset % ALIGN == 0 for offset in offsets)
    assert size == max((o + life.nbytes for o, life in zip(offsets, lives, strict=True)),
                       default=0)
    for i, a in enumerate(lives):
        for j, b in enumerate(lives[:i]):
            if a.first <= b.last and b.first <= a.last:  # alive at a common step
                assert (offsets[i] + a.nbytes <= offsets[j]
                        or offsets[j] + b.nbytes <= offsets[i]), (a, b)
    # never more than every storage apart
    assert size <= sum(-(-life.nbytes // ALIGN) * ALIGN for life in lives)


@NATIVE
@pytest.mark.parametrize(("runner", "mode"), [
    ("mrv1", "full"), ("mrv2", "full_and_piecewise"), ("mrv1", "piecewise"),
])
def test_shared_buffers_give_the_tokens_of_an_eager_replay(llama_oracle, runner, mode):
    decision = Decision(runner, mode, capture_sizes=(1, 2, 4))
    prompts = [[5, 6, 7, 8], [9, 10, 11], [3, 4, 5, 6, 7, 8, 9], [12]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    tokens = []
    for debug in (False, True):
        llm = LLM(str(llama_oracle.path), dtype="float32", block_size=4, num_blocks=32,
                  max_model_len=32, max_num_seqs=4, decision=decision, debug_graphs=debug)
        graphs = llm.report().graphs
        assert graphs is not None
        if not debug:
            assert graphs.backend == "native"
            assert graphs.buffers.startswith("activations: one buffer of ")
            programs = len(graphs.captured)
            assert f"shared by {programs} program(s)" in graphs.buffers
            assert "keeps its own" not in graphs.buffers
        # alone, then batched: each batch size replays its own program over the buffer
        tokens.append([llm.generate([p], params)[0].token_ids for p in prompts]
                      + [o.token_ids for o in llm.generate(prompts, [params] * 4)])
        llm.close()
    assert tokens[0] == tokens[1]


@NATIVE
def test_a_program_that_needs_more_grows_the_buffer_and_moves_the_others(
        llama_oracle, monkeypatch):
    """Captured largest first, a later program can still need more (a piecewise program
    beside a full one, or storages the allocator laid out otherwise): the buffer grows and
    the programs already in it move to the same offsets of the new one. Here every program
    asks for more than the one before, so each capture after the first grows it."""
    asked: list[int] = []

    def growing(lifetimes: list[Lifetime]) -> tuple[list[int], int]:
        offsets, size = _place(lifetimes)
        asked.append(size + ALIGN * 1024 * len(asked))
        return offsets, asked[-1]

    decision = Decision("mrv2", "full_and_piecewise", capture_sizes=(1, 2, 4))
    prompts = [[5, 6, 7, 8], [9, 10, 11], [3, 4, 5, 6, 7, 8, 9], [12]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    tokens = []
    for debug in (False, True):
        if not debug:
            monkeypatch.setattr(pool, "_place", growing)
        llm = LLM(str(llama_oracle.path), dtype="float32", block_size=4, num_blocks=32,
                  max_model_len=32, max_num_seqs=4, decision=decision, debug_graphs=debug)
        monkeypatch.undo()
        graphs = llm.report().graphs
        assert graphs is not None
        if not debug:
            programs = len(graphs.captured)
            assert len(asked) == programs > 2 and asked == sorted(set(asked))
            assert graphs.buffers.startswith(
                f"activations: one buffer of {asked[-1] / 1e6:.1f} MB shared by {programs} "
                "program(s)")
        tokens.append([o.token_ids for o in llm.generate(prompts, [params] * 4)]
                      + [llm.generate([p], params)[0].token_ids for p in prompts])
        llm.close()
    assert tokens[0] == tokens[1]
