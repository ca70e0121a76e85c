"""mrv2's device-side input preparation against mrv1's host-side one, and its request state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.kernels import REGISTRY
from interlock.runners.contract import Sampling, ScheduledBatch, ScheduledSequence
from interlock.runners.graphs.buffers import StaticInputs
from interlock.runners.mrv1.inputs import prepare_host_inputs
from interlock.runners.mrv2.prepare import OP, prepare_step
from interlock.runners.mrv2.states import RequestStates

BLOCK = 4
WIDTH = 8
MAX_LEN = WIDTH * BLOCK


@st.composite
def batches(draw) -> tuple[ScheduledBatch, int, int]:
    """A batch of sequences at arbitrary positions, and padded (tokens, seqs) to stage it at."""
    decode_only = draw(st.booleans())
    count = draw(st.integers(1, 5))
    blocks = iter(draw(st.permutations(range(40))))
    seqs = []
    for i in range(count):
        n = 1 if decode_only else draw(st.integers(1, 7))
        start = draw(st.integers(0, MAX_LEN - n))
        table = tuple(next(blocks) for _ in range(-(-(start + n) // BLOCK)))
        tokens = tuple(draw(st.lists(st.integers(0, 99), min_size=n, max_size=n)))
        seqs.append(ScheduledSequence(f"r{i}", tokens, start, table, Sampling(), 0))
    batch = ScheduledBatch(tuple(seqs))
    pad_seqs = draw(st.integers(0, 3))
    pad_tokens = pad_seqs if decode_only else draw(st.integers(0, 4))
    return batch, batch.num_tokens + pad_tokens, count + pad_seqs


def device_prepare(backend: str, batch: ScheduledBatch, tokens: int, seqs: int):
    states = RequestStates(8, MAX_LEN, WIDTH, torch.device("cpu"))
    step = states.update(batch)
    static = StaticInputs(tokens, seqs, WIDTH, torch.device("cpu"))
    static.input_ids.fill_(77)  # stale values of an earlier step must not leak through
    static.slot_mapping.fill_(5)
    target = static.view(tokens, seqs, batch.decode_only)
    impl = REGISTRY.select(OP, "cpu", "float32", force=backend)
    prepare_step(impl.fn, step, batch.num_tokens, states, BLOCK, target)
    return target, states, step


@pytest.mark.parametrize("backend", ["torch", "triton"])
@settings(max_examples=15)
@given(case=batches())
def test_device_preparation_matches_the_host_preparation(backend, case):
    batch, tokens, seqs = case
    host = prepare_host_inputs(batch, BLOCK, num_tokens=tokens, num_seqs=seqs, table_width=WIDTH)
    target, states, step = device_prepare(backend, batch, tokens, seqs)
    metadata = target.metadata
    for name, ours, expected in (
        ("input_ids", target.input_ids, host.input_ids),
        ("positions", target.positions, host.positions),
        ("slot_mapping", metadata.slot_mapping, host.slot_mapping),
        ("block_tables", metadata.block_tables, host.block_tables),
        ("seq_lens", metadata.seq_lens, host.seq_lens),
        ("query_start_loc", metadata.query_start_loc, host.query_start_loc),
        ("logits_indices", target.logits_indices, host.logits_indices),
    ):
        np.testing.assert_array_equal(ours.numpy(), expected, err_msg=name)
    # Each request's computed count advanced to its new length, on the device.
    assert states.num_computed[step.rows].tolist() == [s.seq_len for s in batch.sequences]


def seq(rid: str, tokens, start: int, table, step: int = 0) -> ScheduledSequence:
    return ScheduledSequence(rid, tuple(tokens), start, tuple(table), Sampling(seed=3), step)


class CountingStates(RequestStates):
    """Request state that records the size of each upload."""

    def __init__(self) -> None:
        super().__init__(4, MAX_LEN, WIDTH, torch.device("cpu"))
        self.uploads: list[tuple[int, int, int, int]] = []

    def _upload(self, admitted, floats, counters, tokens, blocks) -> None:
        self.uploads.append((len(admitted), len(counters), len(tokens), len(blocks)))
        super()._upload(admitted, floats, counters, tokens, blocks)


def test_state_is_uploaded_once_and_sampled_tokens_stay_on_the_device():
    states = CountingStates()
    prefill = ScheduledBatch((seq("a", [5, 6, 7, 8, 9], 0, [3, 1]),))
    step = states.update(prefill)
    seq_lens = torch.tensor([5], dtype=torch.int32)
    states.record_samples(step, seq_lens, torch.tensor([42]))
    states.after_samples(prefill)
    # A decode step: the fed token (42) was written on the device; nothing is uploaded.
    decode = ScheduledBatch((seq("a", [42], 5, [3, 1], step=1),))
    states.update(decode)
    assert states.uploads == [(1, 1, 5, 2), (0, 0, 0, 0)]
    row = int(step.rows[0])
    assert states.token_ids[row, :6].tolist() == [5, 6, 7, 8, 9, 42]
    assert int(states.steps[row]) == 1 and int(states.seeds[row]) == 3
    # The next block, and a new request reusing the row of a finished one.
    grown = ScheduledBatch((seq("a", [43], 6, [3, 1]),), finished_request_ids=())
    states.update(grown)
    assert states.uploads[-1] == (0, 1, 1, 0)  # the scheduler's step count differs: re-sent
    again = ScheduledBatch((seq("b", [1], 0, [9]),), finished_request_ids=("a",))
    assert states.update(again).rows.tolist() == [row]
    assert states.block_tables[row, 0] == 9


def test_more_live_requests_than_rows_is_an_error():
    states = RequestStates(1, MAX_LEN, WIDTH, torch.device("cpu"))
    batch = ScheduledBatch((seq("a", [1], 0, [0]), seq("b", [2], 0, [1])))
    with pytest.raises(RuntimeError, match="all 1 request-state rows are in use"):
        states.update(batch)
