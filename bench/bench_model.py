"""Model execution benchmark: interlock vs transformers `generate` on the same weights.

Measures, side by side in one process with the runs interleaved (medians of --reps):

* batch-1 decode time per output token, (t(N tokens) - t(1 token)) / (N - 1) for both;
* output tokens/s with --concurrency requests (prompts of different lengths), against one
  batched transformers `generate` over the same prompts (left-padded), twice: every request
  asking for --new-tokens tokens, and requests asking for different numbers of tokens
  (transformers runs every row to the longest; only requested tokens are counted);
* batch-1 decode as a fraction of the memory-bandwidth roofline: weight bytes read per
  token / read bandwidth, the bandwidth measured here by streaming a large buffer;
* time to first token of one --long-prompt-token prompt (prefill and one token);
* with a real model (``--model smollm2``, a GGUF file or a model directory): the concurrent
  requests are chat requests (real questions through the model's chat template), and each
  load is timed in a fresh process: cold (converting the GGUF into an empty cache), warm
  (the cached conversion) and warm in bfloat16, with the peak RSS of each.

    .venv/bin/python bench/bench_model.py [--model demo|smollm2|PATH] [--reps 3]
        [--new-tokens 64] [--threads N] [--json] [--runner mrv1|mrv2] [--cudagraph MODE]

interlock runs the decision the shipped policy resolves for the model on the CPU unless
--runner / --cudagraph override it. transformers loads the same weights: the demo's
written as a checkpoint, or a GGUF model's conversion (whose every tensor equals
transformers' own GGUF loader's: tests/runners/models/test_smollm2.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from interlock.app.query import model_target
from interlock.llm import LLM
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.runners.model.checkpoint import write_demo_checkpoint
from interlock.runners.model.config import ModelConfig
from interlock.runners.model.config_json import load_config
from interlock.runners.model.demo import demo_config
from interlock.runners.model.layers import Linear
from interlock.runners.model.sources import DEMO
from interlock.runners.mrv1.inputs import prepare_host_inputs, to_device


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def read_bandwidth(megabytes: int = 512, reps: int = 7) -> dict[str, float]:
    """Bytes/s of two streaming reads of a buffer far larger than any cache (median of
    reps each): a sum, and a one-row GEMV over the buffer as a [4096, N] matrix."""
    values = megabytes * 2**20 // 4
    buffer = torch.ones(values, dtype=torch.float32)
    matrix = buffer.view(4096, -1)
    row = torch.ones(1, 4096)
    probes = {"sum": buffer.sum, "gemv": lambda: row @ matrix}
    result = {}
    for name, probe in probes.items():
        probe()
        result[name] = values * 4 / statistics.median(timed(probe) for _ in range(reps))
    return result


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: everything but the embedding table
    (one row of it is read), plus the LM head even when tied to the embedding."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.embed_tokens
    if model.lm_head is None:  # tied: the table is read whole, as the head
        return total
    return total - embedding.numel() * embedding.element_size()


def matmul_ms(model: torch.nn.Module, rows: int, reps: int) -> float:
    """Milliseconds of one forward's matmuls alone at ``rows`` rows: every projection and the
    logits head, in model order, on random inputs of their shapes (median of reps).
    Transformers runs the same products, so this part of a step is common to both engines."""
    products: list[Callable[[], object]] = []
    for module in model.modules():
        if isinstance(module, Linear) and module is not model.lm_head:  # head: below
            x = torch.randn(rows, module.in_features)
            products.append(lambda m=module, x=x: m(x))
    hidden = torch.randn(rows, model.config.hidden_size)
    products.append(lambda: model.compute_logits(hidden))

    def forward_products() -> None:
        for product in products:  # in model order: weights stream as in a step
            product()

    with torch.inference_mode():
        return statistics.median(timed(forward_products) for _ in range(reps)) * 1e3


Generate = Callable[[list[list[int]], list[int]], list[tuple[int, ...]]]


def greedy_generators(llm: LLM, hf: torch.nn.Module) -> tuple[Generate, Generate]:
    """interlock's and transformers' greedy generation of ``outputs[i]`` tokens per prompt."""

    def ours(prompts: list[list[int]], outputs: list[int]) -> list[tuple[int, ...]]:
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in outputs]
        return [o.token_ids for o in llm.generate(prompts, params)]

    def theirs(prompts: list[list[int]], outputs: list[int]) -> list[tuple[int, ...]]:
        """One batched generate: left-padded prompts, every row runs to the longest output."""
        width, longest = max(len(p) for p in prompts), max(outputs)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest,
                              min_new_tokens=longest, do_sample=False, pad_token_id=0)
        return [tuple(row[:n]) for row, n in zip(out[:, width:].tolist(), outputs, strict=True)]

    return ours, theirs


def warm_up(ours: Generate, theirs: Generate, prompt: list[int],
            prompts: list[list[int]]) -> bool:
    """Runs both engines once on one prompt and once on the whole batch, so that no timed
    run pays a first call's costs; whether their 16 greedy tokens for ``prompt`` agree."""
    same_tokens = ours([prompt], [16]) == theirs([prompt], [16])
    ours(prompts, [4] * len(prompts))
    theirs(prompts, [4] * len(prompts))
    return same_tokens


Runs = dict[str, tuple[list[list[int]], list[int]]]


def interleaved_medians(ours: Generate, theirs: Generate, runs: Runs,
                        reps: int) -> dict[tuple[str, str], float]:
    """The median seconds of each (engine, run): every run of ``runs`` (its prompts and
    output lengths) by both engines in turn, ``reps`` times, so that a change in the
    machine's load falls on both alike."""
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(reps):
        for run, (prompts, outputs) in runs.items():
            for engine, generate in (("interlock", ours), ("transformers", theirs)):
                seconds = timed(lambda g=generate, p=prompts, o=outputs: g(p, o))
                samples.setdefault((engine, run), []).append(seconds)
    return {key: statistics.median(values) for key, values in samples.items()}


def compare(metric: Callable[[str], float]) -> dict[str, float]:
    """A figure for each engine, and interlock's over transformers'."""
    ours, theirs = metric("interlock"), metric("transformers")
    return {"interlock": ours, "transformers": theirs, "ratio": ours / theirs}


def policy_decision(platform: str, target: str) -> Decision:
    """The decision the shipped policy resolves for the model (``demo``: its architecture)
    on ``platform`` (``policy resolve``, capabilities stage included)."""
    model = [demo_config().architecture] if target == DEMO else ["--model", target]
    command = [sys.executable, "-m", "interlock.cli", "resolve", *model, "--platform", platform]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return Decision(**json.loads(result.stdout)["decision"])


def decode_step_breakdown(llm: LLM, prompts: list[list[int]], steps: int) -> dict[str, float]:
    """Median decode step of the engine with every prompt running, the part of it spent in
    the decode attention op (timed alone on the same block tables, times the layers), and
    the part spent in matmuls (``matmul_ms``)."""
    engine = llm.step_loop
    params = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(engine.make_request(prompt, params))
    engine.step()  # prefill
    step_times = [timed(engine.step) for _ in range(steps)]
    runner = engine.runner
    batch = engine.scheduler.schedule()
    # The attention metadata of this batch, built on the host apart from the runner (whose
    # own preparation may advance its state); execute() below prepares it as usual.
    inputs, _ = to_device(prepare_host_inputs(batch, runner.block_size), runner.device)
    metadata = inputs.metadata
    layer = runner.model.attention_layers[0]
    q = torch.randn(len(batch.sequences), layer.num_heads, layer.head_dim)
    with torch.inference_mode():
        attention = statistics.median(
            timed(lambda: layer.attend(q, metadata)) for _ in range(steps)
        )
    engine.scheduler.update(runner.execute(batch), time.perf_counter())
    while engine.has_unfinished():
        engine.step()
    return {"step_ms": statistics.median(step_times) * 1e3,
            "attention_ms": attention * len(runner.model.attention_layers) * 1e3,
            "matmul_ms": matmul_ms(runner.model, len(batch.sequences), steps),
            "context_tokens": int(metadata.seq_lens.max())}


# Questions of different lengths: the concurrent chat requests of a real model.
QUESTIONS = [
    "What is the capital of France?",
    "Name three colors.",
    "Why is the sky blue?",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 12?",
    "Give me a short tip for learning a new language quickly and remembering new words.",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Describe a cat to someone who has never seen one, in two or three sentences.",
    "What does a CPU do?",
    "Suggest a name for a small bakery that sells bread and cakes in a quiet village.",
    "Is a tomato a fruit or a vegetable?",
    "List the planets of the solar system in order from the sun.",
    "Tell me a fun fact about octopuses.",
]

# Peak RSS from VmHWM: ru_maxrss survives exec, so a child would report the parent's peak.
_LOAD_PROBE = """
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
from interlock.llm import LLM
start = time.perf_counter()
llm = LLM(sys.argv[1], dtype=sys.argv[2], device="cpu", max_num_seqs=1)
seconds = time.perf_counter() - start
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(json.dumps({"load_s": seconds, "peak_rss_mb": peak / 1024}))
"""


def load_figures(model: str, threads: int) -> dict[str, dict[str, float]]:
    """``LLM(model)`` timed in fresh processes (max_num_seqs=1), with each one's peak RSS:
    cold into an empty cache (the GGUF conversion included), then warm (the cached
    conversion) in float32 and in bfloat16."""
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "INTERLOCK_CACHE_DIR": os.path.join(cache, "interlock")}
        for label, dtype in (("cold_float32", "float32"), ("warm_float32", "float32"),
                             ("warm_bfloat16", "bfloat16")):
            command = [sys.executable, "-c", _LOAD_PROBE, model, dtype, str(threads)]
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                raise SystemExit(f"loading {model} ({label}) failed: {done.stderr.strip()}")
            results[label] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def machine() -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEMO, help="demo (default), a named model "
                        "(smollm2), a GGUF file or a model directory")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32, help="batch-1 prompt length")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--long-prompt", type=int, default=512, help="prompt length of the "
                        "time-to-first-token run")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: "
                        "torch's own choice)")
    parser.add_argument("--runner", default=None, help="interlock runner (default: the "
                        "shipped policy's decision for the demo on the CPU)")
    parser.add_argument("--cudagraph", default=None, help="cudagraph mode (default: the "
                        "policy's)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    target = model_target(args.model)
    decision = policy_decision("cpu", target)
    if args.runner is not None or args.cudagraph is not None:
        decision = Decision(
            runner=args.runner or decision.runner, cudagraph=args.cudagraph or decision.cudagraph,
            breakable=decision.breakable, compile=decision.compile,
            capture_sizes=decision.capture_sizes,
        )
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    import transformers
    from transformers import AutoModelForCausalLM

    new_tokens, reps, concurrency = args.new_tokens, args.reps, args.concurrency
    generator = torch.Generator().manual_seed(0)

    def draw(low: int, high: int, count: int) -> list[int]:
        return torch.randint(low, high + 1, (count,), generator=generator).tolist()

    config: ModelConfig = demo_config() if target == DEMO else load_config(target)
    top = config.vocab_size - 1
    prompt = draw(3, top, args.prompt_len)
    long_prompt = draw(3, top, args.long_prompt)
    mixed_outputs = draw(new_tokens // 4, 2 * new_tokens, concurrency)

    llm = LLM(target, dtype="float32", device="cpu", max_num_seqs=concurrency, decision=decision)
    if llm.chat_template is not None:  # a real model: real questions, each a chat request
        asked = [QUESTIONS[i % len(QUESTIONS)] for i in range(concurrency)]
        prompts = [llm.apply_chat_template([{"role": "user", "content": q}]) for q in asked]
    else:
        prompts = [draw(3, top, n) for n in draw(8, 64, concurrency)]
    if target == DEMO:
        with tempfile.TemporaryDirectory() as directory:
            hf = AutoModelForCausalLM.from_pretrained(
                write_demo_checkpoint(directory), dtype=torch.float32
            ).eval()
    else:
        hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()

    ours, theirs = greedy_generators(llm, hf)

    same_tokens = warm_up(ours, theirs, prompt, prompts)

    runs = {
        "batch1_one": ([prompt], [1]),
        "batch1_many": ([prompt], [new_tokens]),
        "same_outputs": (prompts, [new_tokens] * concurrency),
        "mixed_outputs": (prompts, mixed_outputs),
        "long_prompt": ([long_prompt], [1]),
    }
    median = interleaved_medians(ours, theirs, runs, reps)

    tpot = compare(lambda e: (median[e, "batch1_many"] - median[e, "batch1_one"])
                   / (new_tokens - 1) * 1e3)
    same = compare(lambda e: concurrency * new_tokens / median[e, "same_outputs"])
    mixed = compare(lambda e: sum(mixed_outputs) / median[e, "mixed_outputs"])
    ttft = compare(lambda e: median[e, "long_prompt"] * 1e3)
    breakdown = decode_step_breakdown(llm, prompts, new_tokens)
    bandwidth = read_bandwidth()
    weight_bytes = decode_weight_bytes(llm.step_loop.runner.model)
    roofline_ms = weight_bytes / max(bandwidth.values()) * 1e3
    loads = None if target == DEMO else load_figures(args.model, torch.get_num_threads())
    figures = {
        "model": args.model,
        "machine": {**machine(), "transformers": transformers.__version__},
        "decision": {"runner": decision.runner, "cudagraph": decision.cudagraph,
                     "breakable": decision.breakable, "compile": decision.compile},
        "settings": {"reps": reps, "new_tokens": new_tokens, "prompt_len": args.prompt_len,
                     "concurrency": concurrency, "prompt_lens": [len(p) for p in prompts],
                     "chat_requests": llm.chat_template is not None,
                     "mixed_max_tokens": mixed_outputs, "long_prompt": args.long_prompt},
        "greedy_tokens_identical": same_tokens,
        "batch1_tpot_ms": tpot,
        "concurrent_same_outputs_tokens_per_s": same,
        "concurrent_mixed_outputs_tokens_per_s": mixed,
        "long_prompt_ttft_ms": ttft,
        "load": loads,
        "concurrent_decode_step": breakdown,
        "roofline": {
            "weight_bytes_per_token": weight_bytes,
            "read_gb_per_s": {k: v / 1e9 for k, v in bandwidth.items()},
            "roofline_ms": roofline_ms,
            "fraction": roofline_ms / tpot["interlock"],
        },
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    m = figures["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} "
          f"({m['torch_threads']} threads), transformers {m['transformers']}")
    print(f"model: {args.model}")
    print(f"interlock: runner {decision.runner}, cudagraph={decision.cudagraph}, breakable="
          f"{decision.breakable}, compile={decision.compile}")
    print(f"greedy tokens identical to transformers: {same_tokens}")
    print("| metric | interlock | transformers | ratio |")
    print("|---|---|---|---|")
    kind = "chat requests" if llm.chat_template is not None else "requests"
    rows = [
        ("batch-1 decode, ms per output token", tpot, ".2f"),
        (f"{concurrency} concurrent {kind}, same max_tokens, output tokens/s", same, ".1f"),
        (f"{concurrency} concurrent {kind}, mixed max_tokens, output tokens/s", mixed, ".1f"),
        (f"time to first token, {args.long_prompt}-token prompt, ms", ttft, ".1f"),
    ]
    for label, row, fmt in rows:
        print(f"| {label} | {row['interlock']:{fmt}} | {row['transformers']:{fmt}} | "
              f"{row['ratio']:.2f}x |")
    kernels = {k.op: k.implementation for k in llm.report().kernels}
    print(f"{concurrency} sequences decoding (up to {breakdown['context_tokens']} tokens of "
          f"context): {breakdown['step_ms']:.1f} ms per step, of which paged_decode_attention "
          f"[{kernels['paged_decode_attention']}] {breakdown['attention_ms']:.1f} ms, "
          f"matmuls (timed alone) {breakdown['matmul_ms']:.1f} ms")
    roof = figures["roofline"]
    reads = ", ".join(f"{k} {v:.1f}" for k, v in roof["read_gb_per_s"].items())
    print(f"roofline: {weight_bytes / 1e6:.1f} MB of weights per token / best read "
          f"({reads} GB/s) = {roof['roofline_ms']:.2f} ms; batch-1 decode at "
          f"{roof['fraction']:.0%} of roofline")
    for label, load in (loads or {}).items():
        print(f"load {label.replace('_', ', ')}: {load['load_s']:.2f} s, peak RSS "
              f"{load['peak_rss_mb']:.0f} MB (fresh process, max_num_seqs=1)")


if __name__ == "__main__":
    main()
