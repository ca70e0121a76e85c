"""Kimi Delta Attention (KDA): the short convolution, the gates, and the delta-rule
recurrence, token by token and chunk by chunk.

KDA is linear attention whose per-request state lives in a pool of fixed-size slots
(``interlock.runners.model.state_pool``), not in the paged cache. Each op takes the pool and
``slots`` [B] int64, each sequence's slot (-1, a padding row: the pool's last slot, kept as
scratch). A sequence with no cached tokens (``seq_lens - query length == 0``: a new or
preempted request) starts from a zero state.
"""

from __future__ import annotations

import torch

from interlock.kernels.reference.contract import torch_op


def _fresh_flags(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor
) -> list[tuple[int, int, int, int]]:
    """Per real sequence (query tokens > 0, seq_len > 0): (index, lo, hi, fresh)."""
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    rows = []
    for b, seq_len in enumerate(lens):
        lo, hi = starts[b], starts[b + 1]
        if hi > lo and seq_len > 0:
            rows.append((b, lo, hi, int(seq_len == hi - lo)))
    return rows


@torch_op("causal_conv1d")
def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """Depthwise causal convolution then SiLU, per sequence of a mixed batch: x [T, C]
    (sequences back to back, query_start_loc [B+1]), weight [C, K], state [S, C, K-1] the
    previous K-1 inputs of each slot (zeros before a fresh sequence), updated in place to
    each sequence's last K-1 inputs. -> [T, C] in x's dtype (computed in weight's)."""
    out = torch.zeros_like(x)
    taps = weight.shape[1]
    slot_list = slots.tolist()
    for b, lo, hi, fresh in _fresh_flags(query_start_loc, seq_lens):
        slot = slot_list[b]
        window = state[slot]
        if fresh:
            window = torch.zeros_like(window)
        full = torch.cat([window, x[lo:hi].t().to(window.dtype)], dim=1)  # [C, K-1 + L]
        conv = torch.nn.functional.conv1d(full[None].to(weight.dtype), weight[:, None],
                                          groups=weight.shape[0])[0]  # [C, L]
        out[lo:hi] = torch.nn.functional.silu(conv).t().to(x.dtype)
        state[slot] = full[:, full.shape[1] - (taps - 1):]
    return out


@torch_op("causal_conv1d_update")
def causal_conv1d_update(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """One token per sequence: x [B, C], weight [C, K], state [S, C, K-1] (slots [B], -1 the
    scratch slot), the window advanced in place. -> SiLU(conv) [B, C]. No host sync: a
    decode graph captures it."""
    window = state[slots]  # [B, C, K-1]
    full = torch.cat([window, x[:, :, None].to(window.dtype)], dim=2)  # [B, C, K]
    conv = (full.to(weight.dtype) * weight).sum(dim=2)
    state[slots] = full[:, :, 1:]
    return torch.nn.functional.silu(conv).to(x.dtype)


@torch_op("kda_gates")
def kda_gates(
    f: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA's forget and input gates from their projections: f [T, H*D] and b [T, H], with
    dt_bias [H*D] and A_log [H] -> (log-decay g = -exp(A_log) * softplus(f + dt_bias)
    [T, H, D], beta = sigmoid(b) [T, H]), both float32. Softplus is exact past 20, as the
    checkpoint's training kernels compute it."""
    heads = a_log.numel()
    shifted = (f.float() + dt_bias.float()).view(f.shape[0], heads, -1)
    softplus = torch.where(shifted > 20.0, shifted, torch.log1p(torch.exp(shifted)))
    g = -torch.exp(a_log.float()).view(1, heads, 1) * softplus
    return g, torch.sigmoid(b.float())


def _l2_normalised(x: torch.Tensor) -> torch.Tensor:
    # x / sqrt(|x|^2 + 1e-6): the epsilon inside the root, as the training kernels have it.
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


@torch_op("kda_recurrent")
def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One KDA step per sequence (decode): q, k [B, H, D], v [B, H, Dv], g [B, H, D]
    (log-decay), beta [B, H]; state [S, H, D, Dv] float32, slots [B] (-1 scratch).

    With q and k L2-normalised and q scaled by D ** -0.5: decay the state per key channel
    (S *= exp(g)), correct it towards v along k by beta (the delta rule,
    S += k (beta (v - S^T k))^T), read q^T S. The state is updated in place. -> [B, H, Dv]
    in v's dtype. No host sync: a decode graph captures it."""
    scale = q.shape[-1] ** -0.5
    q, k = _l2_normalised(q.float()) * scale, _l2_normalised(k.float())
    s = state[slots] * torch.exp(g.float())[..., None]  # [B, H, D, Dv]
    predicted = (k[..., None] * s).sum(dim=2)  # [B, H, Dv]
    delta = (v.float() - predicted) * beta.float()[..., None]
    s = s + k[..., None] * delta[..., None, :]
    state[slots] = s
    return (q[..., None] * s).sum(dim=2).to(v.dtype)


def kda_chunks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial: torch.Tensor, chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, chunk by chunk: q, k, g [L, H, D], v [L, H, Dv], beta [L, H] (float32,
    q and k already normalised, q scaled), initial [H, D, Dv] -> (out [L, H, Dv], final
    state).

    In a chunk, with G_t the running sum of g from its start and S0 the state entering it,
    the correction d_t = beta_t (v_t - S_t^T k_t) of each token depends on the earlier
    ones through A[t, j] = beta_t sum_c k_t[c] k_j[c] exp(G_t[c] - G_j[c]) (j < t):
    (I + A) d = beta (v - (k exp(G)) S0), one unit-lower-triangular solve. Then
    out_t = (q_t exp(G_t))^T S0 + sum_{j <= t} (q_t . k_j exp(G_t - G_j)) d_j, and the state
    leaving is exp(G_C) S0 + sum_j (k_j exp(G_C - G_j)) d_j^T."""
    length = q.shape[0]
    out = v.new_empty(v.shape)
    s = initial
    for lo in range(0, length, chunk_size):
        hi = min(lo + chunk_size, length)
        qc, kc, vc = (x[lo:hi].transpose(0, 1) for x in (q, k, v))  # [H, C, *]
        bc = beta[lo:hi].t()  # [H, C]
        cum = g[lo:hi].transpose(0, 1).cumsum(dim=1)  # [H, C, D]
        size = hi - lo
        lower = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        # exp(G_t - G_j) for j <= t; masked before exp (j > t would grow, not decay).
        gaps = (cum[:, :, None, :] - cum[:, None, :, :]).masked_fill(
            ~lower[None, :, :, None], float("-inf")).exp()  # [H, C, C, D]
        kk = (kc[:, :, None, :] * kc[:, None, :, :] * gaps).sum(-1)  # [H, C, C]
        a = (kk * bc[:, :, None]).tril(-1)
        eye = torch.eye(size, dtype=a.dtype, device=a.device)
        rhs = bc[..., None] * (vc - (kc * cum.exp()) @ s)  # [H, C, Dv]
        d = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        qk = (qc[:, :, None, :] * kc[:, None, :, :] * gaps).sum(-1)  # [H, C, C], j <= t
        out[lo:hi] = ((qc * cum.exp()) @ s + qk @ d).transpose(0, 1)
        last = cum[:, -1:, :]  # [H, 1, D]
        s = last.transpose(1, 2).exp() * s + (kc * (last - cum).exp()).transpose(1, 2) @ d
    return out, s


@torch_op("kda_chunked")
def kda_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    chunk_size: int,
) -> torch.Tensor:
    """KDA over a mixed batch (prefill chunks and decodes), chunk_size tokens at a time
    (``kda_chunks``): q, k, g [T, H, D], v [T, H, Dv], beta [T, H], sequences back to back
    (query_start_loc [B+1], seq_lens [B]); state [S, H, D, Dv] float32, slots [B]. Each
    sequence starts from its slot's state (zeros when fresh) and leaves its final state
    there; what ``kda_recurrent`` computes token by token. -> [T, H, Dv] in v's dtype."""
    scale = q.shape[-1] ** -0.5
    qn, kn = _l2_normalised(q.float()) * scale, _l2_normalised(k.float())
    out = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    slot_list = slots.tolist()
    for b, lo, hi, fresh in _fresh_flags(query_start_loc, seq_lens):
        slot = slot_list[b]
        initial = torch.zeros_like(state[slot]) if fresh else state[slot]
        seq_out, final = kda_chunks(qn[lo:hi], kn[lo:hi], v[lo:hi].float(), g[lo:hi].float(),
                                    beta[lo:hi].float(), initial, chunk_size)
        out[lo:hi] = seq_out.to(v.dtype)
        state[slot] = final
    return out
