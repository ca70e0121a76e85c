"""Greedy tokens of SmolLM2 Q4_1, interlock (weights kept quantized) against llama.cpp on
the same file (issue 29): the first divergence of each parity prompt, and interlock's
log-probabilities of its own token and of llama.cpp's there (an end-of-sequence token,
which has no text, is left out of interlock's count).

llama.cpp runs when ``LLAMA_SIMPLE`` names its ``llama-simple`` (built by
bench/build_llama_cpp.sh), which decodes greedily and prints the
text; interlock's tokenizer turns that text back into tokens (the prompts' continuations
retokenize to llama.cpp's tokens wherever the texts agree, so the first differing token
is where the decoders first chose differently).

    LLAMA_SIMPLE=PATH OMP_NUM_THREADS=1 .venv/bin/python bench/compare_llama_tokens.py
        [--model smollm2] [--new-tokens 32] [--weights native|int8] [--json]

``--weights int8`` runs interlock's products on int8 activations, which round each row to
8 bits per block of 32 as llama.cpp's own Q4_1 and Q8_0 products do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The parity prompts of tests/runners/models/test_smollm2.py (the chat one as the
#: template renders it, since llama-simple applies none).
PROMPTS = {
    "plain": "The capital of France is",
    "story": "Once upon a time, in a small village by the sea,",
    "code": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "chat": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n",
}


def llama_text(binary: str, gguf: Path, prompt: str, tokens: int) -> str:
    done = subprocess.run([binary, "-m", str(gguf), "-n", str(tokens), prompt],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"llama-simple failed ({done.returncode}): {done.stderr[-500:]}")
    out = done.stdout.removesuffix("\n")  # llama-simple ends its output with a newline
    return out[len(prompt):] if out.startswith(prompt) else out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--weights", choices=("native", "int8"), default="native")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    binary = os.environ.get("LLAMA_SIMPLE")
    if not binary or not Path(binary).is_file():
        sys.exit(f"LLAMA_SIMPLE={binary or ''} does not name llama.cpp's llama-simple")

    from interlock.llm import LLM
    from interlock.runners.batching.sampling import SamplingParams
    from interlock.runners.model.sources import NAMED_MODELS, named_file

    gguf = named_file(args.model) if args.model in NAMED_MODELS else Path(args.model)
    llm = LLM(args.model, dtype="float32", device="cpu", weights=args.weights)
    tok = llm.tokenizer
    rows: list[dict[str, Any]] = []
    for name, prompt in PROMPTS.items():
        ids = tok.encode(prompt).ids
        greedy = SamplingParams(temperature=0, max_tokens=args.new_tokens, logprobs=5)
        [out] = llm.generate([ids], greedy)
        ours = list(out.token_ids)
        if out.finish_reason == "stop" and ours:  # its end-of-sequence token has no text
            ours = ours[:-1]
        theirs = tok.encode(llama_text(binary, gguf, prompt, args.new_tokens)).ids
        same = 0
        while same < min(len(ours), len(theirs)) and ours[same] == theirs[same]:
            same += 1
        row: dict[str, Any] = {"prompt": name, "equal_tokens": same, "interlock": len(ours),
                               "llama.cpp": len(theirs)}
        if same < min(len(ours), len(theirs)):
            logprobs = out.outputs[0].logprobs
            assert logprobs is not None
            top = logprobs[same]
            row["at"] = {
                "interlock": [tok.decode([ours[same]]), round(top[ours[same]].logprob, 3)],
                "llama.cpp": [tok.decode([theirs[same]]),
                              round(top[theirs[same]].logprob, 3)
                              if theirs[same] in top else "not in interlock's top 5"],
            }
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{gguf.name}: greedy, {args.new_tokens} new tokens, interlock's weights "
          f"{args.weights}")
    for row in rows:
        line = (f"{row['prompt']:<6} first {row['equal_tokens']} tokens equal "
                f"(interlock {row['interlock']}, llama.cpp {row['llama.cpp']})")
        if "at" in row:
            (mine, lp), (other, their_lp) = row["at"]["interlock"], row["at"]["llama.cpp"]
            line += (f"; then interlock {mine!r} (log p {lp}), llama.cpp {other!r} "
                     f"(interlock's log p {their_lp})")
        print(line)


if __name__ == "__main__":
    main()
