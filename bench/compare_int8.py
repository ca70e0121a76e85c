"""The accuracy of the Q4_1 products on int8 activations (``--weights int8``) against the
float activations' (``--weights native``) on one model (issue 53): greedy agreement on the
bench prompts, and the largest logit difference.

The prompts: the four parity prompts of bench/compare_llama_tokens.py and the 16 random
32-token prompts of bench/bench_cpu_engines.py's 16 requests, each answered greedily with
``--new-tokens`` tokens by both. A prompt agrees when every token does; where one differs,
the step is named with the float run's margin there (its top logit over the int8 run's
token's). Logits are compared at every step both runs reached on the same tokens (the step
whose token differs included), each run eager (no graphs: every step's logits pass the
runner's ``compute_logits``, where they are recorded).

    OMP_NUM_THREADS=1 .venv/bin/python bench/compare_int8.py [--model smollm2]
        [--new-tokens 32] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_cpu_engines import REQUESTS, draw_prompts  # noqa: E402
from compare_llama_tokens import PROMPTS  # noqa: E402


def greedy_with_logits(llm: Any, prompts: list[list[int]], tokens: int
                       ) -> list[tuple[list[int], list[Any]]]:
    """Each prompt's greedy tokens, alone, and the logits [V] of each of its steps."""
    from interlock.runners.batching.sampling import SamplingParams

    runner = llm.step_loop.runner
    seen: list[Any] = []
    inner = runner.compute_logits

    def recorded(inputs: Any) -> Any:
        logits = inner(inputs)
        seen.append(logits[-1].clone())
        return logits

    runner.compute_logits = recorded
    runs = []
    for prompt in prompts:
        seen.clear()
        [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=tokens,
                                                      ignore_eos=True))
        runs.append((list(out.token_ids), list(seen)))
    return runs


def compare(native: tuple[list[int], list[Any]], int8: tuple[list[int], list[Any]]
            ) -> dict[str, Any]:
    """One prompt's agreement, its first differing step and the float run's margin there,
    and the largest logit difference over the steps fed the same tokens."""
    (tokens, logits), (tokens8, logits8) = native, int8
    differ = next((i for i, (a, b) in enumerate(zip(tokens, tokens8, strict=True)) if a != b),
                  None)
    last = len(tokens) if differ is None else differ + 1
    worst = max(float((logits[i] - logits8[i]).abs().max()) for i in range(last))
    margin = None
    if differ is not None:
        row = logits[differ]
        margin = float(row[tokens[differ]] - row[tokens8[differ]])
    return {"agree": differ is None, "first_difference": differ, "margin": margin,
            "max_logit_difference": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from interlock.kernels.native import int8_isa
    from interlock.llm import LLM
    from interlock.runners.contract import Decision

    results: dict[str, dict[str, Any]] = {}
    runs = {}
    for weights in ("native", "int8"):
        llm = LLM(args.model, dtype="float32", device="cpu", weights=weights,
                  decision=Decision(), max_num_seqs=1, max_model_len=256)
        texts = {name: llm.tokenizer.encode(text).ids for name, text in PROMPTS.items()}
        drawn = draw_prompts(llm.step_loop.model.config.vocab_size, 0)(REQUESTS[0], REQUESTS[2])
        prompts = {**texts, **{f"random {i}": p for i, p in enumerate(drawn)}}
        runs[weights] = dict(zip(prompts, greedy_with_logits(llm, list(prompts.values()),
                                                             args.new_tokens), strict=True))
        del llm
    for name in runs["native"]:
        results[name] = compare(runs["native"][name], runs["int8"][name])
    agree = sum(r["agree"] for r in results.values())
    summary = {"model": args.model, "new_tokens": args.new_tokens, "int8_isa": int8_isa(),
               "prompts_agreeing": agree, "prompts": len(results),
               "max_logit_difference": max(r["max_logit_difference"] for r in results.values()),
               "by_prompt": results}
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{args.model}, {args.new_tokens} greedy tokens a prompt, int8 products on "
          f"{summary['int8_isa']}: {agree} of {len(results)} prompts agree; the largest logit "
          f"difference {summary['max_logit_difference']:.4f}")
    print("| prompt | agree | first difference (step) | float margin there | max logit diff |")
    print("|---|---|---:|---:|---:|")
    for name, r in results.items():
        margin = "" if r["margin"] is None else f"{r['margin']:.4f}"
        step = "" if r["first_difference"] is None else r["first_difference"]
        print(f"| {name} | {'yes' if r['agree'] else 'no'} | {step} | {margin} | "
              f"{r['max_logit_difference']:.4f} |")


if __name__ == "__main__":
    main()
