"""The native backend's ops: the torch references' contracts, on float32 CPU tensors.

Each function checks what the C code relies on (dtype, device, shapes, unit strides
inside a row) and passes addresses; the C code checks the values it indexes with
(slots, block ids, positions). An argument outside that contract raises
``NativeArgumentError`` naming it: nothing is copied or converted behind the caller's
back.

``linear`` multiplies through weights packed by ``pack_weight`` (a runner whose table chose
native packs them after loading). A weight that is not packed (its outputs are not a
multiple of 16) goes to torch's product, the reference, recorded on a tape as a foreign
call.
"""

from __future__ import annotations

import torch

from interlock.kernels import quant
from interlock.kernels.native import _cpu, tape
from interlock.kernels.native.threads import follow_torch_threads
from interlock.kernels.packing import PACK_STRIP as STRIP
from interlock.kernels.reference import attention, dense, mla, moe
from interlock.kernels.registry import KernelError

F32 = torch.float32
_reference_linear = tape.foreign(dense.linear)
_reference_attention = tape.foreign(attention.paged_attention)


class NativeArgumentError(KernelError, ValueError):
    """An argument outside what a native kernel accepts."""


def _run(op: int, args: tuple[int | float, ...], *tensors: torch.Tensor) -> None:
    """Run a native op now, and add it to the tape recording, if any, with the tensors
    whose addresses ``args`` holds."""
    recorder = tape.ACTIVE
    if recorder is not None:
        recorder.add(op, args, tensors)
    follow_torch_threads()
    _cpu.call(op, *args)


def _check(name: str, t: torch.Tensor, dim: int, dtype: torch.dtype = F32) -> None:
    if t.dtype is not dtype or not t.is_cpu or t.dim() != dim or t.stride(-1) != 1:
        raise NativeArgumentError(
            f"native kernels take {name} as a {dim}-d {dtype} CPU tensor with unit stride "
            f"in its last dimension, got {tuple(t.shape)} {t.dtype} on {t.device} with "
            f"strides {t.stride()}"
        )


def _check_heads(name: str, t: torch.Tensor) -> None:
    """[T, heads, D] with each row's heads back to back."""
    _check(name, t, 3)
    if t.shape[1] > 1 and t.stride(1) != t.shape[2]:
        raise NativeArgumentError(
            f"native kernels take {name} [T, heads, D] with its heads back to back, got "
            f"strides {t.stride()} for shape {tuple(t.shape)}"
        )


def _check_whole(name: str, t: torch.Tensor, dtype: torch.dtype = F32) -> None:
    if t.dtype is not dtype or not t.is_cpu or not t.is_contiguous():
        raise NativeArgumentError(
            f"native kernels take {name} as a contiguous {dtype} CPU tensor, got "
            f"{tuple(t.shape)} {t.dtype} on {t.device} with strides {t.stride()}"
        )


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool
) -> torch.Tensor:
    _check("x", x, 2)
    if weight.dim() == 2:
        return _reference_linear(x, weight, bias, transposed)
    return _packed_linear(x, weight, bias)


def _packed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x times a packed weight."""
    _check_whole("weight", weight)
    rows, features = x.shape
    if weight.dim() != 3 or weight.shape[1:] != (features, STRIP):
        raise NativeArgumentError(
            f"linear: weight {tuple(weight.shape)} is not packed [out / {STRIP}, in, {STRIP}] "
            f"for x with {features} features"
        )
    outputs = weight.shape[0] * STRIP
    if bias is not None:
        _check_whole("bias", bias)
        if bias.shape != (outputs,):
            raise NativeArgumentError(f"linear: bias {tuple(bias.shape)} for {outputs} outputs")
    y = torch.empty(rows, outputs)
    _run(_cpu.OP_LINEAR, (x.data_ptr(), x.stride(0), weight.data_ptr(),
                          0 if bias is None else bias.data_ptr(), y.data_ptr(), rows, features,
                          outputs),
         x, weight, y, *(() if bias is None else (bias,)))
    return y


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    _check_whole("weight", weight)
    if weight.dim() != 2 or weight.shape[0] % STRIP:
        raise NativeArgumentError(
            f"pack_weight: weight {tuple(weight.shape)} is not [out, in] with a multiple of "
            f"{STRIP} outputs")
    outputs, inputs = weight.shape
    _cpu.call(_cpu.OP_PACK_WEIGHT, weight.data_ptr(), inputs, outputs)
    return weight.view(outputs // STRIP, inputs, STRIP)


def _norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows of x [T, H], or of x [T, heads, H] with each row's heads back to back (q/k
    norms over a fused q/k/v projection's views), normalised: out shaped as x."""
    if x.dim() == 3:
        _check_heads("x", x)
    else:
        _check("x", x, 2)
    _check_whole("weight", weight)
    rows, heads, hidden = x.shape if x.dim() == 3 else (x.shape[0], 1, x.shape[1])
    if weight.shape != (hidden,):
        raise NativeArgumentError(f"rms_norm: weight {tuple(weight.shape)} for rows of {hidden}")
    out = torch.empty(rows * heads, hidden)
    summed = None
    if residual is not None:
        _check("residual", residual, 2)
        if residual.shape != x.shape:
            raise NativeArgumentError(
                f"fused_add_rms_norm: residual {tuple(residual.shape)} for x {tuple(x.shape)}"
            )
        summed = torch.empty(rows, hidden)
    extra = () if residual is None or summed is None else (residual, summed)
    _run(_cpu.OP_RMS_NORM, (x.data_ptr(), x.stride(0), heads,
                            0 if residual is None else residual.data_ptr(),
                            0 if residual is None else residual.stride(0),
                            0 if summed is None else summed.data_ptr(), weight.data_ptr(),
                            out.data_ptr(), rows, hidden, float(eps)), x, weight, out, *extra)
    return out.view(x.shape), summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _norm(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    out, summed = _norm(x, residual, weight, eps)
    assert summed is not None  # for the type checker: a residual was given
    return out, summed


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    _check("x", x, 2)
    rows, width = x.shape
    if width % 2:
        raise NativeArgumentError(f"silu_and_mul: x has an odd width {width}")
    out = torch.empty(rows, width // 2)
    _run(_cpu.OP_SILU_AND_MUL, (x.data_ptr(), x.stride(0), out.data_ptr(), rows, width // 2),
         x, out)
    return out


_reference_moe_experts = tape.foreign(moe.moe_experts)
_reference_mla_decode = tape.foreign(mla.mla_decode_attention)
#: Up to this many sequences the C loop over heads and sequences beats the reference's
#: batched products (measured on the development machine, DeepSeek-V3's 12 heads of
#: 64 + 32 over a 256-wide latent: 0.17 against 0.28 ms at 1 sequence, 0.64 against 0.77
#: at 4, 1.24 against 1.06 at 8, 2.5 against 1.8 at 16); more go to the reference.
MLA_DECODE_NATIVE_BATCH = 4


def moe_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """The reference's expert loop in C over experts packed by ``pack_weight``: each
    expert's rows streamed once through its packed weights (torch's few-row products over
    [out, in] weights took about twice as long, measured on the development machine).
    The C code reads the routing when it runs, so the op is taped natively and a replay
    follows each step's routing; unpacked experts go to the reference (a foreign call)."""
    if w13.dim() != 4 or w2.dim() != 4:
        return _reference_moe_experts(x, w13, w2, topk_weights, topk_ids)
    _check("x", x, 2)
    for name, t in (("w13", w13), ("w2", w2), ("topk_weights", topk_weights)):
        _check_whole(name, t)
    _check_whole("topk_ids", topk_ids, torch.int64)
    tokens, hidden = x.shape
    experts, intermediate = w13.shape[0], w2.shape[2]
    if (topk_ids.dim() != 2 or topk_ids.shape[0] != tokens
            or topk_weights.shape != topk_ids.shape
            or w13.shape != (experts, 2 * intermediate // STRIP, hidden, STRIP)
            or w2.shape != (experts, hidden // STRIP, intermediate, STRIP)):
        raise NativeArgumentError(
            f"moe_experts: x {tuple(x.shape)}, packed w13 {tuple(w13.shape)} and w2 "
            f"{tuple(w2.shape)}, topk_weights {tuple(topk_weights.shape)}, topk_ids "
            f"{tuple(topk_ids.shape)} do not agree"
        )
    out = torch.empty(tokens, hidden)
    _run(_cpu.OP_MOE_EXPERTS, (x.data_ptr(), x.stride(0), w13.data_ptr(), w2.data_ptr(),
                               topk_weights.data_ptr(), topk_ids.data_ptr(), out.data_ptr(),
                               tokens, topk_ids.shape[1], experts, hidden, intermediate),
         x, w13, w2, topk_weights, topk_ids, out)
    return out


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    _check_whole("positions", positions, torch.int64)
    _check_whole("cos_sin_cache", cos_sin_cache)
    for name, t in (("q", q), ("k", k)):
        _check_heads(name, t)
        if t.shape[0] != positions.shape[0] or t.shape[2] != cos_sin_cache.shape[1]:
            raise NativeArgumentError(
                f"rotary_embedding: {name} {tuple(t.shape)} for {positions.shape[0]} positions "
                f"and a table of head size {cos_sin_cache.shape[1]}"
            )
        _run(_cpu.OP_ROTARY, (positions.data_ptr(), t.data_ptr(), t.stride(0), t.shape[0],
                              t.shape[1], t.shape[2], cos_sin_cache.data_ptr(),
                              cos_sin_cache.shape[0]), positions, t, cos_sin_cache)


def store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    for name, t in (("k", k), ("v", v)):
        _check_heads(name, t)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_whole(name, t)
    _check_whole("slot_mapping", slot_mapping, torch.int64)
    if (k.shape != v.shape or k_cache.shape != v_cache.shape
            or tuple(k.shape[1:]) != tuple(k_cache.shape[2:])
            or slot_mapping.shape != (k.shape[0],)):
        raise NativeArgumentError(
            f"store_kv_cache: k {tuple(k.shape)}, v {tuple(v.shape)}, caches "
            f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)}, slots {tuple(slot_mapping.shape)}"
        )
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    _run(_cpu.OP_STORE_KV, (k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                            k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr(),
                            k.shape[0], k.shape[1] * k.shape[2], num_slots),
         k, v, k_cache, v_cache, slot_mapping)


def _check_paged(
    op: str,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    batch: int,
    query_start_loc: torch.Tensor | None = None,
) -> None:
    """What both attentions take besides q [T, Hq, D]: caches [NB, BS, Hk, D] of q's head
    size with Hk dividing Hq; a block table row and a length for each of ``batch``
    sequences; and, for prefill, where each sequence's rows start ([batch + 1])."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_whole(name, t)
    _check_whole("block_tables", block_tables, torch.int32)
    _check_whole("seq_lens", seq_lens, torch.int32)
    if query_start_loc is not None:
        _check_whole("query_start_loc", query_start_loc, torch.int32)
    if (k_cache.shape != v_cache.shape or k_cache.shape[3] != q.shape[2]
            or q.shape[1] % k_cache.shape[2] or block_tables.dim() != 2
            or block_tables.shape[0] != batch or seq_lens.shape != (batch,)
            or query_start_loc is not None and query_start_loc.shape != (batch + 1,)):
        starts = ("" if query_start_loc is None
                  else f", query_start_loc {tuple(query_start_loc.shape)}")
        raise NativeArgumentError(
            f"{op}: q {tuple(q.shape)}, caches {tuple(k_cache.shape)} / "
            f"{tuple(v_cache.shape)}, block tables {tuple(block_tables.shape)}, seq_lens "
            f"{tuple(seq_lens.shape)}{starts}"
        )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    _check_heads("q", q)
    _check_paged("paged_decode_attention", q, k_cache, v_cache, block_tables, seq_lens,
                 q.shape[0])
    batch, heads, head_dim = q.shape
    blocks, block_size, kv_heads = k_cache.shape[:3]
    width = block_tables.shape[1]
    out = torch.empty(batch, heads, head_dim)
    scratch = torch.empty(-(-width * block_size // 8) * 8)  # the scores, in pieces of 8
    _run(_cpu.OP_DECODE_ATTENTION, (q.data_ptr(), q.stride(0), k_cache.data_ptr(),
                                    v_cache.data_ptr(), block_tables.data_ptr(), width,
                                    seq_lens.data_ptr(), out.data_ptr(), batch, heads, kv_heads,
                                    head_dim, block_size, blocks, float(scale),
                                    sliding_window or 0, scratch.data_ptr(), scratch.numel()),
         q, k_cache, v_cache, block_tables, seq_lens, out, scratch)
    return out


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """A head size that is not a multiple of 16 goes to the reference (a foreign call)."""
    _check_heads("q", q)
    if q.shape[2] % STRIP:
        return _reference_attention(q, k_cache, v_cache, block_tables, seq_lens,
                                    query_start_loc, scale, sliding_window)
    batch = seq_lens.shape[0] if seq_lens.dim() == 1 else -1  # -1: lengths fit no batch
    _check_paged("paged_attention", q, k_cache, v_cache, block_tables, seq_lens, batch,
                 query_start_loc)
    tokens, heads, head_dim = q.shape
    blocks, block_size, kv_heads = k_cache.shape[:3]
    out = torch.empty(tokens, heads, head_dim)
    _run(_cpu.OP_PREFILL_ATTENTION, (q.data_ptr(), q.stride(0), k_cache.data_ptr(),
                                     v_cache.data_ptr(), block_tables.data_ptr(),
                                     block_tables.shape[1], seq_lens.data_ptr(),
                                     query_start_loc.data_ptr(), tokens, out.data_ptr(), batch,
                                     heads, kv_heads, head_dim, block_size, blocks,
                                     float(scale), sliding_window or 0),
         q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out)
    return out


def mla_decode_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    kv_b: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The reference's absorbed MLA decode in C: per sequence and head the query folded
    through W_UK, scores over the cached latents and rotary keys read through the block
    table, the softmax, the attended latent and W_UV over it; no per-head K or V and no
    gathered copy of the cache. Lengths and tables are read when it runs (taped natively).
    A batch of more than ``MLA_DECODE_NATIVE_BATCH`` sequences goes to the reference."""
    _check_heads("q_nope", q_nope)
    _check_heads("q_pe", q_pe)
    _check_whole("cache", cache)
    _check_whole("kv_b", kv_b)
    _check_whole("block_tables", block_tables, torch.int32)
    _check_whole("seq_lens", seq_lens, torch.int32)
    batch, heads, nope = q_nope.shape
    rope = q_pe.shape[2]
    rank = kv_b.shape[2]
    if (q_pe.shape[:2] != (batch, heads) or cache.dim() != 3 or cache.shape[2] != rank + rope
            or kv_b.dim() != 3 or kv_b.shape[0] != heads or kv_b.shape[1] <= nope
            or block_tables.dim() != 2 or block_tables.shape[0] != batch
            or seq_lens.shape != (batch,)):
        raise NativeArgumentError(
            f"mla_decode_attention: q_nope {tuple(q_nope.shape)}, q_pe {tuple(q_pe.shape)}, "
            f"cache {tuple(cache.shape)}, kv_b {tuple(kv_b.shape)}, block tables "
            f"{tuple(block_tables.shape)}, seq_lens {tuple(seq_lens.shape)} do not agree"
        )
    if batch > MLA_DECODE_NATIVE_BATCH:
        return _reference_mla_decode(q_nope, q_pe, cache, kv_b, block_tables, seq_lens, scale)
    values = kv_b.shape[1] - nope
    out = torch.empty(batch, heads, values)
    _run(_cpu.OP_MLA_DECODE, (q_nope.data_ptr(), q_nope.stride(0), q_pe.data_ptr(),
                              q_pe.stride(0), cache.data_ptr(), kv_b.data_ptr(),
                              block_tables.data_ptr(), block_tables.shape[1],
                              seq_lens.data_ptr(), out.data_ptr(), batch, heads, nope, rope,
                              rank, values, cache.shape[1], cache.shape[0], float(scale)),
         q_nope, q_pe, cache, kv_b, block_tables, seq_lens, out)
    return out


def store_latent_cache(
    latent: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Each row is read in place, so views of one projection's output need no copy."""
    _check("latent", latent, 2)
    _check("k_pe", k_pe, 2)
    _check_whole("cache", cache)
    _check_whole("slot_mapping", slot_mapping, torch.int64)
    tokens, rank = latent.shape
    rope = k_pe.shape[1]
    if (cache.dim() != 3 or cache.shape[2] != rank + rope or k_pe.shape[0] != tokens
            or slot_mapping.shape != (tokens,)):
        raise NativeArgumentError(
            f"store_latent_cache: latent {tuple(latent.shape)}, k_pe {tuple(k_pe.shape)}, "
            f"cache {tuple(cache.shape)}, slots {tuple(slot_mapping.shape)} do not agree"
        )
    _run(_cpu.OP_STORE_LATENT, (latent.data_ptr(), latent.stride(0), k_pe.data_ptr(),
                                k_pe.stride(0), cache.data_ptr(), slot_mapping.data_ptr(),
                                tokens, rank, rope, cache.shape[0] * cache.shape[1]),
         latent, k_pe, cache, slot_mapping)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y for rows [T, H] of one shape (each rounded once, as torch adds)."""
    _check("x", x, 2)
    _check("y", y, 2)
    if x.shape != y.shape:
        raise NativeArgumentError(f"add: x {tuple(x.shape)} and y {tuple(y.shape)} differ")
    out = torch.empty(x.shape)
    _run(_cpu.OP_ADD, (x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0), out.data_ptr(),
                       x.shape[0], x.shape[1]), x, y, out)
    return out


_SCORING = {"softmax": 0, "sigmoid": 1}
_METHODS = {"greedy": 0, "group_limited_greedy": 1, "noaux_tc": 2}


def moe_grouped_route(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    scoring: str,
    method: str,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's routing in C, token by token (rows of the logits read in place, so
    the first experts' columns of a wider product do): the picks best first, the first of
    equal values winning, as torch.topk orders them."""
    if scoring not in _SCORING:
        raise NativeArgumentError(
            f"moe_grouped_route: scoring {scoring!r} is not softmax or sigmoid")
    if method not in _METHODS:
        raise NativeArgumentError(f"moe_grouped_route: method {method!r} is not greedy, "
                                  "group_limited_greedy or noaux_tc")
    _check("router_logits", router_logits, 2)
    tokens, experts = router_logits.shape
    groups, kept = (1, 1) if method == "greedy" else (n_group, topk_group)
    if (not 1 <= top_k <= experts or groups < 1 or experts % groups
            or not 1 <= kept <= groups or method == "noaux_tc" and experts // groups < 2):
        raise NativeArgumentError(
            f"moe_grouped_route: top {top_k} of {experts} experts in {n_group} groups, "
            f"{topk_group} kept, by {method} (groups must divide the experts; noaux_tc "
            "scores a group by its two best)"
        )
    if correction_bias is not None:
        _check_whole("correction_bias", correction_bias)
        if correction_bias.shape != (experts,):
            raise NativeArgumentError(f"moe_grouped_route: correction_bias "
                                      f"{tuple(correction_bias.shape)} for {experts} experts")
    weights = torch.empty(tokens, top_k)
    ids = torch.empty(tokens, top_k, dtype=torch.int64)
    scratch = torch.empty(4 * experts)
    bias = () if correction_bias is None else (correction_bias,)
    _run(_cpu.OP_GROUPED_ROUTE, (router_logits.data_ptr(), router_logits.stride(0),
                                 0 if correction_bias is None else correction_bias.data_ptr(),
                                 weights.data_ptr(), ids.data_ptr(), tokens, experts, top_k,
                                 _SCORING[scoring], _METHODS[method], groups, kept,
                                 int(renormalize), float(scaling), scratch.data_ptr()),
         router_logits, weights, ids, scratch, *bias)
    return weights, ids


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    _check_whole("ids", ids, torch.int64)
    packed = table.dim() == 3
    if (table.dtype is not F32 or not table.is_cpu or ids.dim() != 1
            or not (table.dim() == 2 or packed and table.is_contiguous()
                    and table.shape[2] == STRIP)):
        raise NativeArgumentError(
            f"embedding: ids {tuple(ids.shape)} into a table {tuple(table.shape)} "
            f"{table.dtype} on {table.device} (2-d, or packed [V / {STRIP}, H, {STRIP}])"
        )
    if packed:
        vocab, hidden = table.shape[0] * STRIP, table.shape[1]
        group, group_stride, row_stride, col_stride = STRIP, table.stride(0), 1, STRIP
    else:
        vocab, hidden = table.shape
        group, group_stride, row_stride, col_stride = 1, table.stride(0), 0, table.stride(1)
    out = torch.empty(ids.shape[0], hidden)
    _run(_cpu.OP_EMBEDDING, (ids.data_ptr(), ids.shape[0], table.data_ptr(), group,
                             group_stride, row_stride, col_stride, vocab, hidden,
                             out.data_ptr()), ids, table, out)
    return out


def select_rows(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    _check("x", x, 2)
    _check_whole("indices", indices, torch.int64)
    if indices.dim() != 1:
        raise NativeArgumentError(f"select_rows: indices {tuple(indices.shape)} are not 1-d")
    rows, hidden = x.shape
    out = torch.empty(indices.shape[0], hidden)
    _run(_cpu.OP_SELECT_ROWS, (x.data_ptr(), x.stride(0), rows, hidden, indices.data_ptr(),
                             indices.shape[0], out.data_ptr()), x, indices, out)
    return out


def _quantized(name: str, weight: torch.Tensor, ggml_type: str) -> tuple[quant.Format, int, int]:
    """The format of a packed quantized weight and its (outputs, inputs)."""
    try:
        fmt = quant.format_of(ggml_type)
        outputs, inputs = quant.shape_of(weight, ggml_type)
    except quant.QuantFormatError as exc:
        raise NativeArgumentError(f"{name}: {exc}") from None
    _check_whole(name, weight, torch.uint8)
    return fmt, outputs, inputs


def quantized_linear(
    x: torch.Tensor, weight: torch.Tensor, ggml_type: str, bias: torch.Tensor | None
) -> torch.Tensor:
    """x times a weight kept quantized (``kernels.quant.pack``), dequantized in registers
    inside the product (the accumulation order: the head of quantized.c)."""
    _check("x", x, 2)
    fmt, outputs, inputs = _quantized("quantized_linear weight", weight, ggml_type)
    rows, features = x.shape
    if features != inputs:
        raise NativeArgumentError(
            f"quantized_linear: x has {features} features, the {ggml_type} weight {inputs}")
    if bias is not None:
        _check_whole("bias", bias)
        if bias.shape != (outputs,):
            raise NativeArgumentError(
                f"quantized_linear: bias {tuple(bias.shape)} for {outputs} outputs")
    y = torch.empty(rows, outputs)
    _run(_cpu.OP_QUANTIZED_LINEAR, (x.data_ptr(), x.stride(0), weight.data_ptr(), fmt.code,
                                    fmt.block, 0 if bias is None else bias.data_ptr(),
                                    y.data_ptr(), rows, features, outputs),
         x, weight, y, *(() if bias is None else (bias,)))
    return y


def quantized_linear_int8(
    x: torch.Tensor, weight: torch.Tensor, ggml_type: str, bias: torch.Tensor | None
) -> torch.Tensor:
    """x times a weight in int8-activation records (``kernels.quant.INT8_FORMATS``): x
    rounded to 8 bits per block, integer dot products (the head of int8.c)."""
    _check("x", x, 2)
    try:
        fmt = quant.int8_format_of(ggml_type)
        outputs, inputs = quant.shape_of(weight, ggml_type)
    except quant.QuantFormatError as exc:
        raise NativeArgumentError(f"quantized_linear_int8 weight: {exc}") from None
    _check_whole("quantized_linear_int8 weight", weight, torch.uint8)
    rows, features = x.shape
    if features != inputs:
        raise NativeArgumentError(
            f"quantized_linear_int8: x has {features} features, the {ggml_type} weight {inputs}")
    if bias is not None:
        _check_whole("bias", bias)
        if bias.shape != (outputs,):
            raise NativeArgumentError(
                f"quantized_linear_int8: bias {tuple(bias.shape)} for {outputs} outputs")
    y = torch.empty(rows, outputs)
    _run(_cpu.OP_QUANTIZED_LINEAR_INT8, (x.data_ptr(), x.stride(0), weight.data_ptr(),
                                         fmt.code, fmt.block,
                                         0 if bias is None else bias.data_ptr(), y.data_ptr(),
                                         rows, features, outputs),
         x, weight, y, *(() if bias is None else (bias,)))
    return y


def quantized_embedding(ids: torch.Tensor, table: torch.Tensor, ggml_type: str) -> torch.Tensor:
    _check_whole("ids", ids, torch.int64)
    fmt, vocab, hidden = _quantized("quantized_embedding table", table, ggml_type)
    if ids.dim() != 1:
        raise NativeArgumentError(f"quantized_embedding: ids {tuple(ids.shape)} are not 1-d")
    out = torch.empty(ids.shape[0], hidden)
    _run(_cpu.OP_QUANTIZED_EMBEDDING, (ids.data_ptr(), ids.shape[0], table.data_ptr(),
                                       fmt.code, fmt.block, vocab, hidden, out.data_ptr()),
         ids, table, out)
    return out


def read_words(buffer: torch.Tensor) -> int:
    """The sum (modulo 2**64, as a signed int64) of a contiguous int64 buffer's words,
    read once front to back by the native threads (torch's thread count): the probe of
    the machine's read bandwidth that decode figures are held to."""
    _check_whole("buffer", buffer, torch.int64)
    out = torch.zeros(1, dtype=torch.int64)
    _run(_cpu.OP_READ_WORDS, (buffer.data_ptr(), buffer.numel() * 8, out.data_ptr()),
         buffer, out)
    return int(out.item())
