"""``policy run``'s command line: its flags and their value checks."""

from __future__ import annotations

import argparse

from interlock.commands.common import add_context_flags, add_decision_log_args, add_policy_args
from interlock.commands.run.orchestrate import IDS_MAX_TOKENS, TEXT_MAX_TOKENS, run
from interlock.core.decision import DTYPE_CHOICES, WEIGHTS


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a model the way the policy decides",
        description="Resolve the decision for the model's architecture, run the model through "
        "the runner plugin it names (graph capture and kernels as decided) and print the "
        "generated tokens.",
    )
    parser.add_argument(
        "--model", required=True, metavar="PATH|NAME",
        help="a Hugging Face model directory, a GGUF file, a named model (smollm2), or `demo` "
        "(the built-in model, random weights)",
    )
    parser.add_argument(
        "--prompt-token-ids", action="append", type=_token_ids, default=[], metavar="1,2,3",
        help="a prompt as token ids; repeat for several (default: one prompt, 1,2,3)",
    )
    parser.add_argument(
        "--prompt", action="append", default=[], metavar="TEXT", type=_utf8,
        help="a text prompt (needs the model's tokenizer.json); repeat for several",
    )
    parser.add_argument(
        "--chat", action="store_true",
        help="send each --prompt as a user message through the model's chat template",
    )
    parser.add_argument(
        "--max-tokens", type=_positive, default=None, metavar="N",
        help=f"tokens to generate per prompt at most (default: {TEXT_MAX_TOKENS} for text "
        f"prompts, {IDS_MAX_TOKENS} for token ids)",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, metavar="T",
        help="0 (the default): greedy, so a run repeats exactly; LLM's SamplingParams, as vLLM's, "
        "default to 1.0",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed")
    parser.add_argument(
        "--ignore-eos", action="store_true",
        help="generate --max-tokens tokens even past the model's end-of-sequence token",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="model dtype (auto: the checkpoint's)",
    )
    parser.add_argument(
        "--weights", choices=WEIGHTS, default="auto",
        help="a GGUF file's quantized weights: kept quantized (native), kept quantized with the "
        "Q4_1 and Q8_0 products on int8 activations (int8: faster, rounds activations to 8 "
        "bits), "
        "converted to floats at load (dequantize), or auto: native where the quantized kernels "
        "run natively",
    )
    parser.add_argument(
        "--tensor-parallel-size", type=_positive, default=1, metavar="N",
        help="split the model across N ranks (processes started here, or the ranks torchrun "
        "started; default: 1)",
    )
    parser.add_argument(
        "--debug-graphs", action="store_true",
        help="replay the capture plan eagerly (the debug graph backend) even on a GPU",
    )
    add_context_flags(parser)
    add_policy_args(parser)
    add_decision_log_args(parser, prompts=True)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--verbose", action="store_true", help="add the trace, kernel choices and captured graphs"
    )
    parser.set_defaults(run=run)


def _utf8(text: str) -> str:
    """A text argument: Python hands an undecodable byte of the command line over as a
    lone surrogate, which the tokenizer cannot encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = text[exc.start].encode("utf-8", "surrogateescape")
        raise argparse.ArgumentTypeError(
            f"not valid UTF-8 (byte 0x{raw.hex()} at position {exc.start})"
        ) from None
    return text


def _token_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of token ids (e.g. 1,2,3)"
        ) from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: token ids are integers >= 0")
    return ids


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return int(text)
