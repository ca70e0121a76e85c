"""Compile every Triton kernel for real GPU targets on a machine without a GPU.

The interpreter (TRITON_INTERPRET=1) checks what kernels compute but accepts
code the GPU compiler rejects. This script runs each op's wrapper on small
CPU tensors with the kernel launch intercepted, compiles every intercepted
launch ahead of time for each target, and prints registers and spills per
kernel. Run it without TRITON_INTERPRET:

    .venv/bin/python tests/kernels/gpu_compile.py [--target cuda:90] [--target hip:gfx942]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

if os.environ.get("TRITON_INTERPRET"):
    sys.exit("gpu_compile.py must run without TRITON_INTERPRET (kernels must be built for a GPU)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from interlock.kernels.triton import (  # noqa: E402
    activation,
    attention,
    indexer,
    kda,
    kv_cache,
    mla,
    moe,
    norm,
    rotary,
    sampling,
    sparse_attention,
)

_SIGNATURE_DTYPES = {
    torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
    torch.int32: "i32", torch.int64: "i64", torch.bool: "i1",
}


@dataclass(frozen=True)
class Launch:
    case: str
    kernel: JITFunction
    args: tuple
    kwargs: dict


def _cases(dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """Representative calls: a Llama-8B-like layer (H 4096, 32/8 heads of 128), a small MoE,
    and a DeepSeek-V3.2 layer's DSA (indexer 64 heads of 128, top-2048; 128 heads over
    latent rows of 512 + 64)."""
    t, h, hq, hk, d, blocks, bs = 4, 4096, 32, 8, 128, 64, 16

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype)

    cache = randn(blocks, bs, hk, d)
    tables = torch.zeros(t, 128, dtype=torch.int32)  # 2048 tokens: several decode partitions
    small_cache = torch.randn(blocks, bs, 4, 64, dtype=dtype)
    small_tables = torch.zeros(t, 4, dtype=torch.int32)
    odd_cache = torch.randn(blocks, bs, 2, 80, dtype=dtype)
    lens = torch.full((t,), 10)
    logits = torch.randn(t, 32000)
    starts = torch.arange(t + 1, dtype=torch.int32)
    index_cache = randn(blocks, bs, 128)
    latent_cache = randn(blocks, bs, 512 + 64)
    topk = torch.zeros(t, 2048, dtype=torch.int32)
    return {
        "rms_norm": lambda: norm.rms_norm(randn(t, h), randn(h), 1e-6),
        "fused_add_rms_norm": lambda: norm.fused_add_rms_norm(randn(t, h), randn(t, h), randn(h),
                                                              1e-6),
        "silu_and_mul": lambda: activation.silu_and_mul(randn(t, 2 * 14336)),
        "rotary_embedding": lambda: rotary.rotary_embedding(
            torch.arange(t), randn(t, hq, d), randn(t, hk, d), torch.randn(64, d)),
        "store_kv_cache": lambda: kv_cache.store_kv_cache(
            randn(t, hk, d), randn(t, hk, d), cache, cache.clone(), torch.arange(t)),
        "paged_decode_attention/d128-gqa4-split": lambda: attention.paged_decode_attention(
            randn(t, hq, d), cache, cache, tables, lens, 0.1),
        "paged_decode_attention/d64-mha-window": lambda: attention.paged_decode_attention(
            randn(t, 4, 64), small_cache, small_cache, small_tables, lens, 0.1, 8),
        "paged_decode_attention/d80-gqa2": lambda: attention.paged_decode_attention(
            randn(t, 4, 80), odd_cache, odd_cache, small_tables, lens, 0.1),
        "paged_attention/d128-gqa4": lambda: attention.paged_attention(
            randn(t, hq, d), cache, cache, tables, lens, torch.arange(t + 1), 0.1),
        "paged_attention/d64-mha-window": lambda: attention.paged_attention(
            randn(t, 4, 64), small_cache, small_cache, small_tables, lens, torch.arange(t + 1),
            0.1, 8),
        "moe_route": lambda: moe.moe_route(torch.randn(t, 64), 8, True),
        "moe_experts/decode": lambda: moe.moe_experts(
            randn(t, 1024), randn(8, 2 * 512, 1024), randn(8, 1024, 512),
            torch.rand(t, 2), torch.randint(0, 8, (t, 2))),
        "moe_experts/prefill": lambda: moe.moe_experts(
            randn(512, 1024), randn(8, 2 * 512, 1024), randn(8, 1024, 512),
            torch.rand(512, 2), torch.randint(0, 8, (512, 2))),
        "dsa_index_topk": lambda: indexer.dsa_index_topk(
            randn(t, 64, 128), torch.rand(t, 64), index_cache, tables, lens, starts, 0.1, 2048),
        "sparse_mla_attention": lambda: sparse_attention.sparse_mla_attention(
            randn(t, 128, 128), randn(t, 128, 64), latent_cache, randn(128, 256, 512), tables,
            lens, starts, topk, 0.1),
        # DeepSeek-V3's MLA on 8 ranks (16 heads each), its latent cache and routing.
        "store_latent_cache/deepseek-v3": lambda: mla.store_latent_cache(
            randn(t, 512), randn(t, 64), randn(blocks, bs, 512 + 64), torch.arange(t)),
        "mla_decode_attention/deepseek-v3": lambda: mla.mla_decode_attention(
            randn(t, 16, 128), randn(t, 16, 64), randn(blocks, bs, 512 + 64),
            randn(16, 128 + 128, 512), tables, lens, 0.1),
        "moe_grouped_route/noaux_tc": lambda: mla.moe_grouped_route(
            torch.randn(t, 256), torch.randn(256), 8, "sigmoid", "noaux_tc", 8, 4, True, 2.5),
        "moe_grouped_route/group_limited_greedy": lambda: mla.moe_grouped_route(
            torch.randn(t, 160), None, 6, "softmax", "group_limited_greedy", 8, 3, False, 1.0),
        # Kimi Linear's KDA decode step: 32 heads of 128 on one rank, a pool of 8 slots.
        "kda_recurrent/kimi-linear": lambda: kda.kda_recurrent(
            randn(t, 32, 128), randn(t, 32, 128), randn(t, 32, 128), torch.randn(t, 32, 128),
            torch.rand(t, 32), torch.zeros(8, 32, 128, 128), torch.arange(t)),
        "sample": lambda: sampling.sample(
            logits, torch.ones(t), torch.full((t,), 50), torch.full((t,), 0.9),
            torch.arange(t), torch.zeros(t, dtype=torch.int64)),
    }


def intercept(dtype: torch.dtype) -> list[Launch]:
    """Run every case with JITFunction.run recording launches instead of running them."""
    launches: list[Launch] = []
    case = ""

    def record(self: JITFunction, *args: object, grid: object, warmup: bool, **kwargs: object):
        launches.append(Launch(case, self, args, kwargs))

    original = JITFunction.run
    JITFunction.run = record
    try:
        for case, call in _cases(dtype).items():  # noqa: B007  (read by record)
            call()
    finally:
        JITFunction.run = original
    return launches


def _signature(launch: Launch) -> tuple[dict, dict, dict]:
    names = [p.name for p in launch.kernel.params]
    bound = dict(zip(names, launch.args, strict=False))
    bound.update({k: v for k, v in launch.kwargs.items() if k in names})
    options = {k: v for k, v in launch.kwargs.items() if k not in names}
    signature, constexprs = {}, {}
    for param in launch.kernel.params:
        value = bound[param.name]
        if param.is_constexpr or value is None:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + _SIGNATURE_DTYPES[value.dtype]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(
                f"{launch.kernel.__name__}: cannot type argument {param.name}={value!r}")
    return signature, constexprs, options


def _found(match: re.Match | None) -> str:
    return match.group(1) if match else "?"


def _resources(compiled: object, target: GPUTarget) -> str:
    if target.backend == "cuda":
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
            ptx.write(compiled.asm["ptx"])
            ptx.flush()
            from triton.backends.nvidia.compiler import get_ptxas

            report = subprocess.run(
                [get_ptxas(target.arch).path, "-v", f"--gpu-name=sm_{target.arch}a", ptx.name,
                 "-o", os.devnull], capture_output=True, text=True, check=True).stderr
        regs = re.search(r"Used (\d+) registers", report)
        spills = re.search(r"(\d+) bytes spill stores", report)
        return f"regs {_found(regs)}, spill {_found(spills)} B"
    asm = compiled.asm["amdgcn"]
    vgprs = re.search(r"; NumVgprs: (\d+)", asm)
    scratch = re.search(r"; ScratchSize: (\d+)", asm)
    return f"vgprs {_found(vgprs)}, scratch {_found(scratch)} B"


def _target(spec: str) -> GPUTarget:
    backend, _, arch = spec.partition(":")
    if backend == "cuda":
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip":
        return GPUTarget("hip", arch, 64)
    raise SystemExit(f"unknown target {spec!r}; use cuda:<sm> (e.g. cuda:90) or hip:<gfx> (e.g. "
                     "hip:gfx942)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", help="cuda:<sm> or hip:<gfx>")
    parser.add_argument("--dtype", action="append", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args(argv)
    targets = [_target(t) for t in args.target or ["cuda:90", "hip:gfx942"]]
    failures = 0
    for dtype_name in args.dtype or ["bfloat16", "float32"]:
        for launch in intercept(getattr(torch, dtype_name)):
            signature, constexprs, options = _signature(launch)
            for target in targets:
                label = f"{launch.case:42} {launch.kernel.__name__:26} {dtype_name:9} {target.arch}"
                try:
                    compiled = triton.compile(ASTSource(launch.kernel, signature, constexprs),
                                              target=target, options=options)
                except Exception as exc:  # report every kernel, then fail
                    failures += 1
                    print(f"{label}  FAILED: {str(exc).splitlines()[0] if str(exc) else exc!r}")
                    continue
                print(f"{label}  {_resources(compiled, target)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
