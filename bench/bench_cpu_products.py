"""The native CPU kernels against torch's on one core, side by side in one process.

SmolLM2-135M's shapes (30 layers of q/k/v 576->960, o 576->576, gate/up 576->3072 and
down 1536->576, and the tied head 576->49152), each weight its own, so that a pass
streams 538 MB from memory as a forward does:

* products at 1 to 512 rows: the native kernels over packed weights against torch's
  (MKL) over the layout the torch path stores (``stored_transposed``); the head only up
  to 64 rows (a prefill computes the logits of last tokens only);
* prefill attention of one 512-token sequence (9 query heads over 3 KV heads of 64, the
  keys in a paged cache): native against the reference (torch's SDPA), per layer.

The two alternate, run by run; medians of --reps.

    .venv/bin/python bench/bench_cpu_products.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from interlock.kernels import REGISTRY
from interlock.kernels.native import unavailable

HIDDEN, INTERMEDIATE, VOCAB, LAYERS = 576, 1536, 49152, 30
# (inputs, outputs) of one layer's projections
SHAPES = [(HIDDEN, 960), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTERMEDIATE), (INTERMEDIATE, HIDDEN)]
ROWS = (1, 4, 8, 16, 32, 64, 512)


def op(name: str, backend: str) -> Callable:
    return REGISTRY.select(name, "cpu", "float32", force=backend).fn


def alternate(runs: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds of each run, the runs taking turns."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}


def products(reps: int) -> None:
    pack, native, torch_linear = op("pack_weight", "native"), op("linear", "native"), op(
        "linear", "torch")
    weights = []  # (inputs, outputs, packed, torch's layout, transposed)
    for inputs, outputs in [*SHAPES * LAYERS, (HIDDEN, VOCAB)]:
        w = torch.randn(outputs, inputs) * 0.02
        transposed = outputs > inputs  # what stored_transposed picks in float32
        weights.append((inputs, outputs, pack(w.clone()),
                        w.t().contiguous() if transposed else w, transposed))
    print("| rows | native ms | torch ms | native GFLOPS | torch GFLOPS | native / torch |")
    print("|---:|---:|---:|---:|---:|---:|")
    for rows in ROWS:
        used = weights if rows <= 64 else weights[:-1]
        x = {inputs: torch.randn(rows, inputs) for inputs, _ in SHAPES}
        flops = 2 * rows * sum(inputs * outputs for inputs, outputs, *_ in used)
        median = alternate({
            "native": lambda x=x, used=used: [native(x[i], p, None, False)
                                              for i, _, p, _, _ in used],
            "torch": lambda x=x, used=used: [torch_linear(x[i], w, None, t)
                                             for i, _, _, w, t in used],
        }, reps)
        a, b = median["native"], median["torch"]
        print(f"| {rows} | {a * 1e3:.1f} | {b * 1e3:.1f} | {flops / a / 1e9:.1f} | "
              f"{flops / b / 1e9:.1f} | {a / b:.2f}x |")


def attention(reps: int) -> None:
    tokens, heads, kv_heads, head_dim, block_size = 512, 9, 3, 64, 16
    blocks = tokens // block_size
    k_cache, v_cache = (torch.randn(blocks, block_size, kv_heads, head_dim) for _ in "kv")
    fused = torch.randn(tokens, heads + 2 * kv_heads, head_dim)
    args = (fused[:, :heads], k_cache, v_cache, torch.arange(blocks, dtype=torch.int32)[None],
            torch.tensor([tokens], dtype=torch.int32),
            torch.tensor([0, tokens], dtype=torch.int32), head_dim**-0.5, None)
    native, reference = op("paged_attention", "native"), op("paged_attention", "torch")
    difference = (native(*args) - reference(*args)).abs().max().item()
    median = alternate({"native": lambda: native(*args), "torch": lambda: reference(*args)},
                       reps)
    a, b = median["native"], median["torch"]
    print(f"\nprefill attention, 512 tokens, one layer: native {a * 1e3:.2f} ms, torch SDPA "
          f"{b * 1e3:.2f} ms ({a / b:.2f}x); largest difference {difference:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    why = unavailable("cpu")
    if why is not None:
        raise SystemExit(f"the native kernels cannot run here: {why}")
    torch.set_num_threads(1)
    with torch.inference_mode():
        products(args.reps)
        attention(args.reps)


if __name__ == "__main__":
    main()
