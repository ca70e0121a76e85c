"""Kimi Delta Attention's decode step (``kda_recurrent``): one program per (sequence, head,
block of value columns).

Each value column of a head's state [D, Dv] (float32, in the pool slot the sequence owns)
evolves on its own under the delta rule, so a program takes ``BLOCK_V`` columns: loaded
into registers once, decayed per key channel, corrected along k by the delta rule, read by q
and stored back in place: the step reads and writes the state once, where the torch
reference goes through memory four times. q and k are L2-normalised in the program, as
the reference does. No host sync, so a decode graph captures it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from interlock.kernels.triton.runtime import unit_stride, warps_for


@triton.jit
def _kda_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, slots_ptr, out_ptr,
    q_row, q_head, k_row, k_head, v_row, v_head, g_row, g_head, beta_row, beta_head,
    heads, num_slots, dim, v_dim, scale,
    BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    columns = tl.program_id(2) * BLOCK_V
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    slot = tl.where(slot < 0, slot + num_slots, slot)  # -1: the scratch slot, the last
    d = tl.arange(0, BLOCK_D)
    e = columns + tl.arange(0, BLOCK_V)
    d_mask = d < dim
    e_mask = e < v_dim
    q = tl.load(q_ptr + seq * q_row + head * q_head + d, mask=d_mask, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + seq * k_row + head * k_head + d, mask=d_mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + seq * v_row + head * v_head + e, mask=e_mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + seq * g_row + head * g_head + d, mask=d_mask, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + seq * beta_row + head * beta_head).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    base = state_ptr + (slot * heads + head) * dim * v_dim
    offsets = d[:, None] * v_dim + e[None, :]
    mask = d_mask[:, None] & e_mask[None, :]
    s = tl.load(base + offsets, mask=mask, other=0.0) * tl.exp(g)[:, None]
    predicted = tl.sum(k[:, None] * s, axis=0)
    delta = (v - predicted) * beta
    s = s + k[:, None] * delta[None, :]
    tl.store(base + offsets, s, mask=mask)
    out = tl.sum(q[:, None] * s, axis=0)
    tl.store(out_ptr + (seq * heads + head) * v_dim + e, out.to(out_ptr.dtype.element_ty),
             mask=e_mask)


def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """The state must be contiguous float32 (it is updated in place)."""
    batch, heads, dim = q.shape
    v_dim = v.shape[-1]
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"the KDA state must be contiguous float32, got {state.dtype} with "
                         f"strides {tuple(state.stride())}")
    for name, tensor in (("q", q), ("k", k), ("v", v), ("g", g)):
        unit_stride(name, tensor)
    out = torch.empty(batch, heads, v_dim, dtype=v.dtype, device=v.device)
    if batch == 0:
        return out
    # 32 columns of 128 keys: 4K floats of state per program, held without spills.
    block_d, block_v = triton.next_power_of_2(dim), min(triton.next_power_of_2(v_dim), 32)
    _kda_step_kernel[(batch, heads, triton.cdiv(v_dim, block_v))](
        q, k, v, g, beta, state, slots.contiguous(), out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        heads, state.shape[0], dim, v_dim, dim ** -0.5,
        BLOCK_D=block_d, BLOCK_V=block_v, num_warps=warps_for(block_d * block_v, 1024, most=4),
    )
    return out
