"""Kernel micro-benchmark on a GPU: each Triton kernel against its torch reference.

For every op at a few shapes of a Llama-3-8B layer (and a Qwen3-30B-A3B MoE
layer, a 152k vocabulary for sampling), both implementations run side by side
in one process: median kernel time over CUDA events (L2 flushed before each
call), the op's minimal DRAM traffic over that time as achieved bandwidth, its
fraction of the device's peak memory bandwidth (from the memory clock and bus
width; also against a measured device-to-device copy), the torch/Triton time
ratio, and the largest difference between the two outputs.

    .venv/bin/python bench/bench_kernels.py [--dtype bfloat16] [--iters 50] [--op NAME]
                                            [--quick] [--json PATH]

Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch

from interlock.kernels import REGISTRY
from interlock.kernels.reference import moe as ref

Outputs = Callable[[tuple, object], tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class Setup:
    args: tuple
    bytes_moved: int  # minimal DRAM traffic of one call
    outputs: Outputs  # (args, return value) -> the tensors to compare
    comparable: bool = True  # random sampling draws differ by design
    exact: bool = False  # token ids: must be equal


@dataclass(frozen=True)
class Case:
    op: str
    shape: str
    build: Callable[[torch.device, torch.dtype], Setup]


@dataclass(frozen=True)
class Row:
    op: str
    shape: str
    dtype: str
    torch_ms: float
    triton_ms: float
    speedup: float  # torch time / Triton time
    triton_gbps: float
    peak_fraction: float | None  # of the spec peak memory bandwidth
    copy_fraction: float  # of the measured copy bandwidth
    max_abs_diff: float | None
    reference_max: float | None  # largest |output| of the torch reference, for scale
    exact: bool


def _returned(args: tuple, out: object) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _size(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# Llama-3-8B: hidden 4096, 32 query / 8 KV heads of 128, MLP 14336, cache blocks of 16.
HIDDEN, Q_HEADS, KV_HEADS, HEAD, INTER, BLOCK = 4096, 32, 8, 128, 14336, 16


def _norm(tokens: int, fused: bool) -> Callable[[torch.device, torch.dtype], Setup]:
    def build(device: torch.device, dtype: torch.dtype) -> Setup:
        x = torch.randn(tokens, HIDDEN, device=device, dtype=dtype)
        weight = torch.randn(HIDDEN, device=device, dtype=dtype)
        if fused:
            residual = torch.randn_like(x)
            return Setup((x, residual, weight, 1e-6), 4 * _size(x) + _size(weight), _returned)
        return Setup((x, weight, 1e-6), 2 * _size(x) + _size(weight), _returned)

    return build


def _silu(tokens: int) -> Callable[[torch.device, torch.dtype], Setup]:
    def build(device: torch.device, dtype: torch.dtype) -> Setup:
        x = torch.randn(tokens, 2 * INTER, device=device, dtype=dtype)
        return Setup((x,), _size(x) * 3 // 2, _returned)

    return build


def _rotary(tokens: int) -> Callable[[torch.device, torch.dtype], Setup]:
    def build(device: torch.device, dtype: torch.dtype) -> Setup:
        positions = torch.randint(0, 8192, (tokens,), device=device)
        qkv = torch.randn(tokens, (Q_HEADS + 2 * KV_HEADS) * HEAD, device=device, dtype=dtype)
        q = qkv[:, : Q_HEADS * HEAD].view(tokens, Q_HEADS, HEAD)
        k = qkv[:, Q_HEADS * HEAD : (Q_HEADS + KV_HEADS) * HEAD].view(tokens, KV_HEADS, HEAD)
        cos_sin = torch.randn(8192, HEAD, device=device)
        moved = 2 * (_size(q) + _size(k)) + tokens * HEAD * 4 + _size(positions)
        return Setup((positions, q, k, cos_sin), moved, lambda args, _: (args[1], args[2]))

    return build


def _store(tokens: int) -> Callable[[torch.device, torch.dtype], Setup]:
    def build(device: torch.device, dtype: torch.dtype) -> Setup:
        blocks = tokens // BLOCK + 64
        k, v = (torch.randn(tokens, KV_HEADS, HEAD, device=device, dtype=dtype) for _ in range(2))
        caches = [torch.zeros(blocks, BLOCK, KV_HEADS, HEAD, device=device, dtype=dtype)
                  for _ in range(2)]
        slots = torch.randperm(blocks * BLOCK, device=device)[:tokens]
        slots[::7] = -1  # padding tokens
        return Setup((k, v, *caches, slots), 2 * (_size(k) + _size(v)) + _size(slots),
                     lambda args, _: (args[2], args[3]))

    return build


def _paged_cache(device: torch.device, dtype: torch.dtype, contexts: list[int]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(-(-c // BLOCK) for c in contexts)
    blocks = width * len(contexts)
    k_cache, v_cache = (torch.randn(blocks, BLOCK, KV_HEADS, HEAD, device=device, dtype=dtype)
                        for _ in range(2))
    tables = torch.randperm(blocks, device=device).view(len(contexts), width).int()
    return k_cache, v_cache, tables


def _decode(batch: int, context: int) -> Callable[[torch.device, torch.dtype], Setup]:
    def build(device: torch.device, dtype: torch.dtype) -> Setup:
        k_cache, v_cache, tables = _paged_cache(device, dtype, [context] * batch)
        q = torch.randn(batch, Q_HEADS, HEAD, device=device, dtype=dtype)
        lens = torch.full((batch,), context, device=device, dtype=torch.int32)
        kv_bytes = 2 * batch * context * KV_HEADS * HEAD * q.element_size()
        return Setup((q, k_cache, v_cache, tables, lens, HEAD**-0.5), kv_bytes + 2 * _size(q),
                     _returned)

    return build


def _prefill(seqs: int, new: int, cached: int) -> Callable[[torch.device, torch.dtype], Setup]:
    def build(device: torch.device, dtype: torch.dtype) -> Setup:
        k_cache, v_cache, tables = _paged_cache(device, dtype, [cached + new] * seqs)
        q = torch.randn(seqs * new, Q_HEADS, HEAD, device=device, dtype=dtype)
        lens = torch.full((seqs,), cached + new, device=device, dtype=torch.int32)
        starts = torch.arange(0, seqs * new + 1, new, device=device, dtype=torch.int32)
        kv_bytes = 2 * seqs * (cached + new) * KV_HEADS * HEAD * q.element_size()
        return Setup((q, k_cache, v_cache, tables, lens, starts, HEAD**-0.5),
                     kv_bytes + 2 * _size(q), _returned)

    return build


# Qwen3-30B-A3B: 128 experts, 8 per token, hidden 2048, expert MLP 768.
EXPERTS, TOP_K, MOE_HIDDEN, MOE_INTER = 128, 8, 2048, 768


def _route(tokens: int) -> Callable[[torch.device, torch.dtype], Setup]:
    def build(device: torch.device, dtype: torch.dtype) -> Setup:
        logits = torch.randn(tokens, EXPERTS, device=device, dtype=dtype)
        # Compare the weights only: 16-bit logits tie, and torch.topk orders ties its own way.
        return Setup((logits, TOP_K, True), _size(logits) + tokens * TOP_K * 12,
                     lambda args, out: (out[0],))

    return build


def _experts(tokens: int) -> Callable[[torch.device, torch.dtype], Setup]:
    def build(device: torch.device, dtype: torch.dtype) -> Setup:
        x = torch.randn(tokens, MOE_HIDDEN, device=device, dtype=dtype)
        w13 = torch.randn(EXPERTS, 2 * MOE_INTER, MOE_HIDDEN, device=device, dtype=dtype) * 0.02
        w2 = torch.randn(EXPERTS, MOE_HIDDEN, MOE_INTER, device=device, dtype=dtype) * 0.02
        weights, ids = ref.moe_route(torch.randn(tokens, EXPERTS, device=device), TOP_K, True)
        touched = torch.unique(ids).numel()  # only these experts' weights are read
        moved = touched * (_size(w13[0]) + _size(w2[0])) + 2 * _size(x)
        return Setup((x, w13, w2, weights, ids), moved, _returned)

    return build


VOCAB = 151936


def _sample(batch: int, greedy: bool) -> Callable[[torch.device, torch.dtype], Setup]:
    def build(device: torch.device, dtype: torch.dtype) -> Setup:
        logits = torch.randn(batch, VOCAB, device=device) * 3
        params = (
            torch.full((batch,), 0.0 if greedy else 0.8, device=device),
            torch.full((batch,), 0 if greedy else 50, device=device),
            torch.full((batch,), 1.0 if greedy else 0.9, device=device),
            torch.arange(batch, device=device),
            torch.zeros(batch, dtype=torch.int64, device=device),
        )
        return Setup((logits, *params), _size(logits), _returned, comparable=greedy, exact=True)

    return build


CASES: tuple[Case, ...] = (
    *(Case("rms_norm", f"T={t} H={HIDDEN}", _norm(t, False)) for t in (1, 256, 8192)),
    *(Case("fused_add_rms_norm", f"T={t} H={HIDDEN}", _norm(t, True)) for t in (1, 256, 8192)),
    *(Case("silu_and_mul", f"T={t} I={INTER}", _silu(t)) for t in (1, 256, 8192)),
    *(Case("rotary_embedding", f"T={t} 32/8x128", _rotary(t)) for t in (1, 256, 8192)),
    *(Case("store_kv_cache", f"T={t} 8x128", _store(t)) for t in (1, 256, 8192)),
    *(Case("paged_decode_attention", f"B={b} ctx={c} 32/8x128", _decode(b, c))
      for b, c in ((1, 8192), (32, 1024), (64, 4096))),
    *(Case("paged_attention", f"{s}x{n} new +{c} cached 32/8x128", _prefill(s, n, c))
      for s, n, c in ((1, 2048, 0), (8, 256, 512))),
    *(Case("moe_route", f"T={t} E={EXPERTS} k={TOP_K}", _route(t)) for t in (1, 4096)),
    *(Case("moe_experts", f"T={t} E={EXPERTS} k={TOP_K} {MOE_HIDDEN}/{MOE_INTER}", _experts(t))
      for t in (1, 64, 2048)),
    *(Case("sample", f"B={b} V={VOCAB} {'greedy' if g else 'T=.8 k=50 p=.9'}", _sample(b, g))
      for b, g in ((1, True), (64, True), (64, False))),
)


def _clone(args: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def median_ms(fn: Callable[[], object], iters: int, flush: torch.Tensor) -> float:
    """Median of ``iters`` calls timed by CUDA events, the L2 cache flushed before each."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_bandwidth(device: torch.device) -> float | None:
    """Bytes/s from the memory clock and bus width (double data rate), where torch has them."""
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    return 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else None


def copy_bandwidth(device: torch.device, flush: torch.Tensor) -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write)."""
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / (median_ms(lambda: dst.copy_(src), 10, flush) / 1e3)


def implementations(op: str, platform: str, dtype: torch.dtype) -> tuple[Callable, Callable]:
    """(Triton, torch) implementations of ``op`` from the registry."""
    name = str(dtype).removeprefix("torch.")
    return tuple(REGISTRY.select(op, platform, name, force=b).fn for b in ("triton", "torch"))


def max_difference(
    setup: Setup, triton_fn: Callable, torch_fn: Callable
) -> tuple[float, float] | None:
    """(largest absolute difference between the two implementations' outputs, largest
    |reference output|), run on copies of the inputs; None where not comparable."""
    if not setup.comparable:
        return None
    ours, theirs = _clone(setup.args), _clone(setup.args)
    got = setup.outputs(ours, triton_fn(*ours))
    want = setup.outputs(theirs, torch_fn(*theirs))
    diff = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want, strict=True))
    return diff, max(w.float().abs().max().item() for w in want)


def run_case(case: Case, dtype: torch.dtype, iters: int, device: torch.device,
             flush: torch.Tensor, peak: float | None, copy: float) -> Row:
    triton_fn, torch_fn = implementations(case.op, "rocm" if torch.version.hip else "cuda", dtype)
    setup = case.build(device, dtype)
    compared = max_difference(setup, triton_fn, torch_fn)
    triton_ms = median_ms(lambda: triton_fn(*setup.args), iters, flush)
    torch_ms = median_ms(lambda: torch_fn(*setup.args), iters, flush)
    gbps = setup.bytes_moved / (triton_ms / 1e3) / 1e9
    return Row(case.op, case.shape, str(dtype).removeprefix("torch."), torch_ms, triton_ms,
               torch_ms / triton_ms, gbps, gbps * 1e9 / peak if peak else None,
               gbps * 1e9 / copy, *(compared or (None, None)), setup.exact)


def run(cases: Iterable[Case], dtype: torch.dtype, iters: int) -> tuple[dict, list[Row]]:
    device = torch.device("cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)  # > any L2
    peak = peak_bandwidth(device)
    copy = copy_bandwidth(device, flush)
    machine = {
        "device": torch.cuda.get_device_name(device),
        "peak_gbps": peak / 1e9 if peak else None,
        "copy_gbps": copy / 1e9,
        "torch": torch.__version__,
    }
    rows = []
    for case in cases:
        rows.append(run_case(case, dtype, iters, device, flush, peak, copy))
        torch.cuda.empty_cache()
    return machine, rows


def _table(machine: dict, rows: list[Row]) -> str:
    peak = f"{machine['peak_gbps']:.0f} GB/s" if machine["peak_gbps"] else "unknown"
    lines = [
        f"{machine['device']}: peak memory bandwidth {peak}, measured copy "
        f"{machine['copy_gbps']:.0f} GB/s; torch {machine['torch']}",
        "",
        "| op | shape | dtype | torch ms | triton ms | torch/triton | triton GB/s | of peak "
        "| of copy | max abs diff (of max) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        of_peak = f"{r.peak_fraction:.0%}" if r.peak_fraction is not None else "-"
        diff = "n/a (random)"
        if r.max_abs_diff is not None:
            diff = f"{r.max_abs_diff:.2e} ({r.reference_max:.2g})"
        lines.append(
            f"| {r.op} | {r.shape} | {r.dtype} | {r.torch_ms:.4f} | {r.triton_ms:.4f} | "
            f"{r.speedup:.2f}x | {r.triton_gbps:.0f} | {of_peak} | {r.copy_fraction:.0%} | "
            f"{diff} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--iters", type=int, default=50, help="timed calls per kernel")
    parser.add_argument("--op", action="append", help="only these ops (repeatable)")
    parser.add_argument("--quick", action="store_true", help="10 timed calls per kernel")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    known = sorted({c.op for c in CASES})
    unknown = set(args.op or ()) - set(known)
    if unknown:
        parser.error(f"unknown op(s) {sorted(unknown)}; known: {', '.join(known)}")
    if not torch.cuda.is_available():
        print("bench_kernels.py needs a CUDA or ROCm GPU; none is available here, nothing run.")
        return 0
    cases = [c for c in CASES if not args.op or c.op in args.op]
    machine, rows = run(cases, getattr(torch, args.dtype), 10 if args.quick else args.iters)
    print(_table(machine, rows))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": machine, "rows": [asdict(r) for r in rows]}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
