"""``policy run``'s run: check the inputs, decide, load the model, generate, show it."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from contextlib import redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.app.timing import (
    RequestTimes,
    decode_ms_per_token,
    mean_ttft_ms,
    output_tokens_per_s,
)
from interlock.commands.common import load, query_of, record_decision, write_json
from interlock.commands.run.capture import cap_capture_sizes, step_tokens
from interlock.commands.run.render import (
    header,
    output_dict,
    render_outputs,
    render_tail,
    run_document,
)
from interlock.commands.run.stream import Stream
from interlock.core.errors import InputError, InterlockError

if TYPE_CHECKING:
    from interlock.app.outputs import Prompt, RequestOutput
    from interlock.policy.resolution import Resolution
    from interlock.policy.trace import Step
    from interlock.runners.batching.sampling import SamplingParams
    from interlock.runners.contract import RunnerReport
    from interlock.runners.model.checkpoint import ModelSource

DEFAULT_PROMPT = (1, 2, 3)
TEXT_MAX_TOKENS = 64  # enough for a sentence or two of an answer
IDS_MAX_TOKENS = 16


def run(args: argparse.Namespace) -> int:
    worker = _torchrun_worker()
    if worker is not None:
        return worker
    from interlock.app.decided_by import decided_by
    from interlock.app.query import decide_query
    from interlock.plugins import load_registry
    from interlock.runners.batching.sampling import SamplingParams

    if args.chat and not args.prompt:
        raise InputError("--chat sends each --prompt TEXT as a user message; give at least one")
    policy = load(args)
    # The plugins the decision asks (stage 5) and the run uses: discovered before deciding.
    plugins = load_registry(args.settings.environ)
    # Everything the user gave is checked before the decision is logged: the model's form
    # (a config.json it cannot run is still explained, then refused), the sampling values.
    query = query_of(args, policy, runs_here=True,
                     tensor_parallel_size=args.tensor_parallel_size,
                     tensor_parallel_given=f"--tensor-parallel-size {args.tensor_parallel_size}")
    max_tokens = args.max_tokens
    if max_tokens is None:
        max_tokens = TEXT_MAX_TOKENS if args.prompt else IDS_MAX_TOKENS
    params = SamplingParams(
        max_tokens=max_tokens, temperature=args.temperature, seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    resolution = decide_query(policy, query)
    print(f"policy run: {decided_by(resolution)}", file=sys.stderr)
    plugin = plugins.runner(resolution.decision.runner).plugin
    prompts: list[Prompt] = [*args.prompt_token_ids, *args.prompt] or [DEFAULT_PROMPT]
    # Text replies stream to a terminal as they are generated; the header comes first.
    stream = Stream(sys.stdout, resolution, plugin.provider, args) if (
        args.prompt and not args.json and sys.stdout.isatty()
    ) else None
    recorded: dict[str, Any] = dict(
        model=args.model, overrides=dict(query.overrides),
        prompts=prompts if args.decision_log_prompts else None,
    )
    from interlock.runners.model.checkpoint import source_in
    from interlock.runners.model.sources import DEMO

    try:
        # Plugin code (the runner) prints to stderr: stdout is this command's output.
        with redirect_stdout(sys.stderr):
            # The model query_of resolved (the policy decided on it) is the one loaded, not
            # resolved again; a config it cannot run fails the run, recorded as such.
            source = source_in(None if query.model == DEMO else Path(str(query.model)))
            result = _execute(args, resolution, source, prompts, params, stream)
        outcome = run_outcome(result[2], result[1])
    except BaseException as exc:
        # What ran is recorded even when it failed, then the failure goes on as before.
        kind = "interrupted" if isinstance(exc, KeyboardInterrupt) else type(exc).__name__
        outcome = {"error": kind, "message": str(exc)[:500]}
        if isinstance(exc, KeyboardInterrupt):
            # Ctrl-C: show what was generated so far (exit 130 is the command line's).
            partial = [output_dict(o) for o in getattr(exc, "outputs", ())]
            if partial and args.json:
                exc.details = {"outputs": partial}  # type: ignore[attr-defined]
            elif partial:
                sys.stdout.write(render_outputs(partial))
        raise
    finally:
        # One record of the run, from one place, whatever its outcome.
        record_decision(args, resolution, "policy run", **recorded, outcome=outcome)
    outputs, report, metrics, trace = result
    document = run_document(resolution, plugin.provider, outputs, report, metrics, trace,
                         verbose=args.verbose, prompts=args.prompt, chat=args.chat)
    if args.json:
        write_json(document)
    elif stream is not None:  # the header and the text replies are out already
        token_ids = [o for o in document["outputs"] if "prompt" not in o]
        sys.stdout.write(render_outputs(token_ids)
                         + render_tail(document, trace, verbose=args.verbose))
    else:
        sys.stdout.write(header(resolution, plugin.provider, report) + "\n"
                         + render_outputs(document["outputs"])
                         + render_tail(document, trace, verbose=args.verbose))
    return 0


def run_outcome(metrics: dict[str, Any], report: RunnerReport) -> dict[str, Any]:
    """A decision record's outcome of a run: tokens, TTFT and TPOT, the graphs captured."""
    graphs = report.graphs.to_dict() if report.graphs is not None else {}
    return {
        "requests": metrics["requests"],
        "output_tokens": metrics["output_tokens"],
        "ttft_ms": metrics["ttft_ms"],
        "tpot_ms": metrics["tpot_ms"],
        "graphs": {
            "backend": graphs.get("backend"),
            "captured_sizes": list(graphs.get("captured_sizes", [])),
            "failed": len(graphs.get("failed", {})),
        },
        "fallbacks": list(report.fallbacks),
    }


def _execute(
    args: argparse.Namespace,
    resolution: Resolution,
    model: ModelSource,
    prompts: list[Prompt],
    params: SamplingParams,
    stream: Stream | None,
) -> tuple[list[RequestOutput], RunnerReport, dict[str, Any], tuple[Step, ...]]:
    """Run the prompts (with ``--chat`` the text ones as user messages), streaming text
    replies to ``stream``; returns (outputs, runner report, metrics, the trace with this
    run's own steps)."""
    import torch

    from interlock.core.platform import device_for
    from interlock.llm import LLM

    device = device_for(resolution.context.platform)
    decision = resolution.decision
    steps, trace = step_tokens(prompts), resolution.trace
    if decision.capture_sizes is not None and steps is not None:
        decision, note = cap_capture_sizes(decision, steps)
        trace = (*trace, note) if note is not None else trace
    start = time.perf_counter()
    try:
        llm = LLM(
            model,
            dtype=args.dtype,
            weights=args.weights,
            device=device,
            seed=args.seed,
            max_num_seqs=len(prompts),
            max_num_batched_tokens=2048 if steps is None else min(2048, steps),
            decision=decision,
            tensor_parallel_size=args.tensor_parallel_size,
            debug_graphs=args.debug_graphs or None,  # without the flag: the environment
            settings=args.settings,  # read where the command started
        )
        loaded = time.perf_counter()
        if args.chat:
            first = len(args.prompt_token_ids)
            prompts = [*prompts[:first], *(
                llm.apply_chat_template([{"role": "user", "content": text}])
                for text in args.prompt
            )]
        on_tokens = None
        if stream is not None:
            on_tokens = stream.start(llm)
        outputs = llm.generate(prompts, params, on_tokens=on_tokens)
    except torch.OutOfMemoryError as exc:
        raise RunFailed(f"out of memory on {device}: {' '.join(str(exc).split())[:300]}") from exc
    if device == "cuda":
        torch.cuda.synchronize()
    done = time.perf_counter()
    metrics = {**run_metrics([o.times for o in outputs if o.times is not None]),
               "requests": len(outputs),
               "output_tokens": sum(len(o.token_ids) for o in outputs),
               "generate_s": round(done - loaded, 4),
               "load_s": round(loaded - start, 4)}
    report = llm.report()
    llm.close()  # the other tensor-parallel ranks, if any
    return outputs, report, metrics, trace


def run_metrics(times: Sequence[RequestTimes]) -> dict[str, float | None]:
    """A run's TTFT, TPOT and output tokens/s, as :mod:`interlock.app.timing` defines
    them for every engine (the measurement's figures on the same requests are these)."""
    if not times:
        return {"ttft_ms": None, "tpot_ms": None, "output_tokens_per_s": None}
    decode = decode_ms_per_token(times)
    return {
        "ttft_ms": round(mean_ttft_ms(times), 3),
        "tpot_ms": None if decode is None else round(decode, 3),
        "output_tokens_per_s": round(output_tokens_per_s(times), 2),
    }


class RunFailed(InterlockError):
    """The run itself failed (exit 4)."""

    kind = "runtime"


def _torchrun_worker() -> int | None:
    """Under torchrun every rank runs this command; a rank other than 0 serves rank 0's
    orders (interlock.runners.parallel.worker) and returns its exit status."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or os.environ.get("RANK", "0") == "0":
        return None
    from interlock.core.env import Settings
    from interlock.runners.parallel.distributed import (
        ParallelSettings,
        Rendezvous,
        TensorParallelError,
    )
    from interlock.runners.parallel.worker import serve

    try:
        # This worker's start is its boundary: the environment is read here, once.
        rdzv = Rendezvous.from_torchrun(ParallelSettings.of(Settings.read()))
    except TensorParallelError as exc:
        raise InputError(str(exc)) from None
    assert rdzv is not None
    return serve(rdzv)
