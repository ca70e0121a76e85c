"""Rotary position embedding (neox style), in place."""

from __future__ import annotations

import torch

from interlock.kernels.reference.contract import torch_op


@torch_op("rotary_embedding")
def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Neox-style rotary embedding applied in place.

    positions [T] int64; q [T, Hq, D]; k [T, Hk, D]; cos_sin_cache
    [max_positions, D] float32 holding cos in the first D/2 columns and sin in
    the last D/2.
    """
    half = cos_sin_cache.shape[-1] // 2
    cos_sin = cos_sin_cache.index_select(0, positions).to(q.dtype)
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    for t in _heads_of(q, k):
        x1, x2 = t[..., :half], t[..., half:]
        x1_sin = x1 * sin  # the one value both halves need before x1 is overwritten
        x1.mul_(cos).addcmul_(x2, sin, value=-1)
        x2.mul_(cos).add_(x1_sin)


def _heads_of(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(q, k), or one view of both when k's heads directly follow q's in memory (views of
    one fused q/k/v projection): the rotation then runs once, with half the ops."""
    if (
        q.stride() == k.stride()
        and q.dtype == k.dtype
        and q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
        and k.storage_offset() == q.storage_offset() + q.shape[1] * q.stride(1)
    ):
        shape = (q.shape[0], q.shape[1] + k.shape[1], q.shape[2])
        return (q.as_strided(shape, q.stride(), q.storage_offset()),)
    return q, k
