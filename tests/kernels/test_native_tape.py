"""Tapes of native kernel calls: a replay equals a fresh run on whatever the buffers hold."""

from __future__ import annotations

import pytest
import torch

from interlock.kernels import REGISTRY
from interlock.kernels.native import unavailable

pytestmark = pytest.mark.skipif(unavailable("cpu") is not None,
                                reason=f"native kernels: {unavailable('cpu')}")


def native(op: str):
    return REGISTRY.select(op, "cpu", "float32", force="native").fn


def block(ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, norm: torch.Tensor,
          picks: torch.Tensor) -> torch.Tensor:
    """An embedding, a norm, a product (``weight`` packed), SwiGLU and a row gather: native
    ops only."""
    hidden = native("embedding")(ids, table)
    normed = native("rms_norm")(hidden, norm, 1e-5)
    return native("select_rows")(native("silu_and_mul")(
        native("linear")(normed, weight, None, False)), picks)


def test_a_replay_reads_the_inputs_of_the_moment_and_writes_the_recorded_outputs() -> None:
    from interlock.kernels.native import tape

    gen = torch.Generator().manual_seed(0)
    table = torch.randn(50, 16, generator=gen)
    weight = native("pack_weight")(torch.randn(32, 16, generator=gen))
    norm = torch.randn(16, generator=gen)
    ids, picks = torch.tensor([3, 7, 11]), torch.tensor([2, 0])
    with tape.recording() as recorded:
        out = block(ids, table, weight, norm, picks)
    assert recorded.calls == 5
    for new_ids, new_picks in (([1, 2, 3], [0, 1]), ([49, 0, 5], [2, 2])):
        ids.copy_(torch.tensor(new_ids))
        picks.copy_(torch.tensor(new_picks))
        recorded.replay()
        assert torch.equal(out, block(ids, table, weight, norm, picks))


def test_a_torch_op_while_recording_is_named_and_ends_the_recording() -> None:
    from interlock.kernels.native import tape

    x = torch.ones(2, 4)
    with pytest.raises(tape.TapeError, match=r"aten\.add\.Tensor ran while a native tape was "
                                             "recording"), tape.recording():
        native("rms_norm")(x + 1, torch.ones(4), 1e-5)
    assert tape.ACTIVE is None
    torch.add(x, 1)  # nothing is left guarding torch ops


def test_a_bad_index_met_at_replay_is_an_error_not_a_wild_write() -> None:
    from interlock.kernels.native import tape

    table, ids = torch.randn(10, 4), torch.tensor([1, 2])
    with tape.recording() as recorded:
        native("embedding")(ids, table)
    ids[1] = 10
    with pytest.raises(ValueError, match=r"a token id is outside the vocabulary \(0\.\.9\)"):
        recorded.replay()


def test_another_backends_op_is_replayed_as_a_python_call_on_the_same_buffers() -> None:
    from interlock.kernels.native import tape

    torch_norm = tape.foreign(REGISTRY.select("rms_norm", "cpu", "float32", force="torch").fn)
    x, weight = torch.randn(3, 8), torch.randn(8)
    with tape.recording() as recorded:
        out = native("silu_and_mul")(torch_norm(x, weight, 1e-5))
    assert (recorded.calls, recorded.foreign_calls) == (1, 1)
    x.copy_(torch.randn(3, 8))
    recorded.replay()
    assert torch.equal(out, native("silu_and_mul")(torch_norm(x, weight, 1e-5)))


def test_native_ops_inside_a_foreign_call_belong_to_it_not_to_the_tape() -> None:
    """A collective's masked lookup (torch ops around a native embedding) is one call: a
    replay runs it once, and the tape holds no record of its native op."""
    from interlock.kernels.native import tape

    table = torch.randn(10, 4)

    def masked_rows(ids: torch.Tensor) -> torch.Tensor:
        rows = native("embedding")(ids.clamp(0, 4), table)
        return rows * (ids < 5).unsqueeze(-1).to(rows.dtype)

    ids = torch.tensor([1, 7, 3])
    with tape.recording() as recorded:
        out = native("silu_and_mul")(tape.foreign(tape.foreign(masked_rows))(ids))
    assert (recorded.calls, recorded.foreign_calls) == (1, 1)
    ids.copy_(torch.tensor([8, 2, 4]))
    recorded.replay()
    assert torch.equal(out, native("silu_and_mul")(masked_rows(ids)))
    assert tape.ACTIVE is None


def test_a_reshape_is_taped_as_a_view_and_refused_as_a_copy() -> None:
    from interlock.kernels.native import tape

    x = torch.randn(4, 6)
    with tape.recording():
        assert x.reshape(2, 12).data_ptr() == x.data_ptr()
    with pytest.raises(tape.TapeError, match=r"aten\.(clone|reshape)\.default"), tape.recording():
        x.t().reshape(24)


def test_recording_does_not_import_torch_dynamo() -> None:
    """A dispatch mode's default wrapper imports torch._dynamo (~2 s) on first use: a model
    load captures its tapes without paying for it."""
    import subprocess
    import sys

    code = ("import sys, torch\nfrom interlock.kernels.native import tape\nx = torch.ones(2)\n"
            "with tape.recording():\n    x.view(1, 2)\n"
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
