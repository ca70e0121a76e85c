"""The debug and native backends' programs: what they replay, and the checks that catch a
wrong one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from interlock.core.env import GRAPHS_FAIL_CAPTURE
from interlock.kernels.native import unavailable as native_unavailable
from interlock.llm import LLM
from interlock.runners.contract import Decision
from interlock.runners.graphs.backends import (
    CaptureError,
    DebugGraphBackend,
    NativeGraphBackend,
    select_backend,
)
from interlock.runners.graphs.buffers import StaticInputs
from interlock.runners.graphs.capture import ForcedFailures, forward_logits
from interlock.runners.graphs.modes import Strategy
from interlock.runners.graphs.plan import GraphKey


@pytest.fixture(scope="module")
def model(llama_oracle):
    llm = LLM(str(llama_oracle.path), block_size=4, num_blocks=16, max_model_len=32,
              decision=Decision("mrv1"))
    return llm.step_loop.runner.model


def decode_inputs(model, seq_lens: list[int]):
    """Static inputs of a decode batch over blocks 0.. with the given lengths."""
    static = StaticInputs(len(seq_lens), len(seq_lens), 8, torch.device("cpu"))
    static.fill_padding(len(seq_lens), len(seq_lens))
    static.input_ids.copy_(torch.arange(3, 3 + len(seq_lens)))
    static.positions.copy_(torch.tensor(seq_lens) - 1)
    static.block_tables.copy_(torch.arange(len(seq_lens) * 8).view(-1, 8))
    static.seq_lens.copy_(torch.tensor(seq_lens))
    static.logits_indices.copy_(torch.arange(len(seq_lens)))
    return static.view(len(seq_lens), len(seq_lens), True)


NATIVE = pytest.mark.skipif(native_unavailable("cpu") is not None,
                            reason=f"native kernels: {native_unavailable('cpu')}")
BACKENDS = [pytest.param(DebugGraphBackend, id="debug"),
            pytest.param(NativeGraphBackend, id="native", marks=NATIVE)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_breakable_program_replays_the_forward_through_its_breaks(model, backend):
    inputs = decode_inputs(model, [5, 9])
    with torch.inference_mode():
        program = backend().capture_breakable(lambda: forward_logits(model, inputs))
        assert (program.segments, program.breaks) == (3, 2)
        expected = forward_logits(model, inputs)
        inputs.input_ids.copy_(torch.tensor([7, 8]))  # a new step through the same buffers
        changed = forward_logits(model, inputs)
        [logits] = program.replay(inputs.metadata)
    assert not torch.equal(changed, expected)
    torch.testing.assert_close(logits, changed, atol=0, rtol=0)


@NATIVE
def test_a_native_segment_replays_a_whole_forward_from_the_static_buffers(model):
    inputs = decode_inputs(model, [5, 9])
    with torch.inference_mode():
        segment, [logits] = NativeGraphBackend().capture(lambda: forward_logits(model, inputs))
        inputs.input_ids.copy_(torch.tensor([7, 8]))
        inputs.positions.copy_(torch.tensor([5, 9]))
        inputs.metadata.seq_lens.copy_(torch.tensor([6, 10], dtype=torch.int32))
        expected = forward_logits(model, inputs)
        segment.replay()
    torch.testing.assert_close(logits, expected, atol=0, rtol=0)


def test_replay_that_meets_attention_out_of_capture_order_is_an_error(model):
    inputs = decode_inputs(model, [4])
    with torch.inference_mode():
        program = DebugGraphBackend().capture_breakable(lambda: forward_logits(model, inputs))
        swapped = dataclasses.replace(program, steps=program.steps[::-1])
        with pytest.raises(CaptureError, match="replay reached attention layer 0 where "
                           "capture had layer 1"):
            swapped.replay(inputs.metadata)


def test_forced_failures_and_backend_choice(monkeypatch):
    key = GraphKey(Strategy.FULL, 4, 4, "decode")
    # ModelSpec.fail_capture: $INTERLOCK_GRAPHS_FAIL_CAPTURE as read where the run started.
    assert ForcedFailures.parse("all").applies(key)
    assert not ForcedFailures.parse("2,8").applies(key)
    assert not ForcedFailures.parse(None).applies(key)
    with pytest.raises(ValueError, match=f"{GRAPHS_FAIL_CAPTURE.name}='two' is invalid"):
        ForcedFailures.parse("two")
    assert select_backend("auto", torch.device("cpu")).name == "debug"
    if native_unavailable("cpu") is None:
        assert select_backend("auto", torch.device("cpu"), tapeable=True).name == "native"
        # ModelSpec.debug_graphs: the environment is read once, where the LLM is made.
        monkeypatch.setenv("INTERLOCK_DEBUG_GRAPHS", "1")
        assert select_backend("auto", torch.device("cpu"), tapeable=True).name == "native"
        assert select_backend("auto", torch.device("cpu"), tapeable=True,
                              debug=True).name == "debug"
    with pytest.raises(ValueError, match="the native graph backend replays the native CPU"):
        select_backend("native", torch.device("cpu"), tapeable=False)
    with pytest.raises(ValueError, match="the cuda graph backend needs a CUDA/ROCm device"):
        select_backend("cuda", torch.device("cpu"))
    with pytest.raises(ValueError, match="graph backend 'fast' is unknown; allowed: auto"):
        select_backend("fast", torch.device("cpu"))
