"""``policy run``: decide how to run a model, run it through the chosen runner plugin, show it.

The decision is resolved for the model's architecture (traits from its
config; ``demo`` is the built-in model) by ``interlock.model_run``, the path
``interlock.llm.LLM`` takes too; one line on stderr names the runner, cudagraph
mode and breakable with the policy line that chose each, and the runner is
instantiated through the plugin that registers it. torch is imported only
inside ``run`` (and where the platform is detected).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import asdict
from pathlib import Path
from typing import Any

from interlock.commands.common import (
    add_context_flags,
    add_policy_args,
    context_flags_of,
    load,
    overrides_of,
    write_json,
)
from interlock.core.decision import DTYPE_CHOICES
from interlock.core.errors import InputError, InterlockError
from interlock.core.fields import show_scalar

DEFAULT_PROMPT = (1, 2, 3)
TEXT_MAX_TOKENS = 64  # enough for a sentence or two of an answer
IDS_MAX_TOKENS = 16


def add_parser(subparsers: argparse._SubParsersAction) -> None:
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
        "--prompt", action="append", default=[], metavar="TEXT",
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
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0: greedy")
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
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--verbose", action="store_true", help="add the trace, kernel choices and captured graphs"
    )
    parser.set_defaults(run=run)


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


def run(args: argparse.Namespace) -> int:
    worker = _torchrun_worker()
    if worker is not None:
        return worker
    from interlock.model_run import check_runs_here, decided_by, model_target, resolve_model_run
    from interlock.plugins import load_registry
    from interlock.runners.engine.sampling import SamplingParams
    from interlock.runners.model.checkpoint import resolve_model

    if args.chat and not args.prompt:
        raise InputError("--chat sends each --prompt TEXT as a user message; give at least one")
    policy = load(args)
    check_runs_here(args.platform)
    # Everything the user gave is checked before the decision is logged: the model's form
    # (a config.json it cannot run is still explained, then refused), the sampling values.
    model = model_target(args.model)
    if model != "demo" and not Path(model, "config.json").is_file():
        resolve_model(model)  # raises the error naming every accepted form
    max_tokens = args.max_tokens
    if max_tokens is None:
        max_tokens = TEXT_MAX_TOKENS if args.prompt else IDS_MAX_TOKENS
    params = SamplingParams(
        max_tokens=max_tokens, temperature=args.temperature, seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    flags = context_flags_of(args, policy)
    flags["features"], flags["sources"] = _with_tensor_parallel(args, flags)
    resolution = resolve_model_run(policy, model, overrides_of(args), **flags)
    print(f"policy run: {decided_by(resolution)}", file=sys.stderr)
    plugin = load_registry().runner(resolution.decision.runner).plugin
    prompts: list[Any] = [*args.prompt_token_ids, *args.prompt] or [DEFAULT_PROMPT]
    # Text replies stream to a terminal as they are generated; the header comes first.
    stream = _Stream(sys.stdout, resolution, plugin.provider, args) if (
        args.prompt and not args.json and sys.stdout.isatty()
    ) else None
    try:
        # Plugin code (the runner) prints to stderr: stdout is this command's output.
        with _debug_graphs(args.debug_graphs), redirect_stdout(sys.stderr):
            result = _execute(args, resolution, model, prompts, params, stream)
    except KeyboardInterrupt as exc:
        # Ctrl-C: show what was generated so far (exit 130 is the command line's).
        partial = [_output_dict(o) for o in getattr(exc, "outputs", ())]
        if partial and args.json:
            exc.details = {"outputs": partial}  # type: ignore[attr-defined]
        elif partial:
            sys.stdout.write(_render_outputs(partial))
        raise
    outputs, report, metrics, trace = result
    document = _document(resolution, plugin.provider, outputs, report, metrics, trace,
                         verbose=args.verbose, prompts=args.prompt, chat=args.chat)
    if args.json:
        write_json(document)
    elif stream is not None:  # the header and the text replies are out already
        token_ids = [o for o in document["outputs"] if "prompt" not in o]
        sys.stdout.write(_render_outputs(token_ids)
                         + _render_tail(document, trace, verbose=args.verbose))
    else:
        sys.stdout.write(_header(resolution, plugin.provider, report) + "\n"
                         + _render_outputs(document["outputs"])
                         + _render_tail(document, trace, verbose=args.verbose))
    return 0


@contextmanager
def _debug_graphs(enabled: bool) -> Iterator[None]:
    """Force the debug graph backend for this run only (runners read it when they load)."""
    from interlock.runners.graphs.backends import DEBUG_ENV

    previous = os.environ.get(DEBUG_ENV)
    if enabled:
        os.environ[DEBUG_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = previous


def _execute(
    args: argparse.Namespace,
    resolution: Any,
    model: str,
    prompts: list[Any],
    params: Any,
    stream: _Stream | None,
) -> tuple[Any, Any, dict[str, Any], tuple[Any, ...]]:
    """Run the prompts (with ``--chat`` the text ones as user messages), streaming text
    replies to ``stream``; returns (outputs, runner report, metrics, the trace with this
    run's own steps)."""
    import torch

    from interlock.llm import LLM
    from interlock.model_run import device_for

    device = device_for(resolution.context.platform)
    decision = resolution.decision
    steps, trace = _step_tokens(prompts), resolution.trace
    if decision.capture_sizes is not None and steps is not None:
        decision, note = _cap_capture_sizes(decision, steps)
        trace = (*trace, note) if note is not None else trace
    start = time.perf_counter()
    try:
        llm = LLM(
            model,
            dtype=args.dtype,
            device=device,
            seed=args.seed,
            max_num_seqs=len(prompts),
            **({} if steps is None else {"max_num_batched_tokens": min(2048, steps)}),
            decision=decision,
            tensor_parallel_size=args.tensor_parallel_size,
        )
        loaded = time.perf_counter()
        if args.chat:
            first = len(args.prompt_token_ids)
            prompts = [*prompts[:first], *(
                llm.apply_chat_template([{"role": "user", "content": text}])
                for text in prompts[first:]
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
    generated = sum(len(o.token_ids) for o in outputs)
    decoding = [o for o in outputs if len(o.token_ids) > 1]
    metrics = {
        "ttft_ms": round(1e3 * sum(o.ttft_s for o in outputs) / len(outputs), 3),
        "tpot_ms": round(1e3 * sum(o.tpot_s for o in decoding) / len(decoding), 3)
        if decoding else None,
        "requests": len(outputs),
        "output_tokens": generated,
        "generate_s": round(done - loaded, 4),
        "output_tokens_per_s": round(generated / (done - loaded), 2),
        "load_s": round(loaded - start, 4),
    }
    report = llm.report()
    llm.close()  # the other tensor-parallel ranks, if any
    return outputs, report, metrics, trace


class RunFailed(InterlockError):
    """The run itself failed (exit 4)."""

    kind = "runtime"


def _torchrun_worker() -> int | None:
    """Under torchrun every rank runs this command; a rank other than 0 serves rank 0's
    orders (interlock.runners.parallel.worker) and returns its exit status."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or os.environ.get("RANK", "0") == "0":
        return None
    from interlock.runners.parallel.distributed import Rendezvous, TensorParallelError
    from interlock.runners.parallel.worker import serve

    try:
        rdzv = Rendezvous.from_torchrun()
    except TensorParallelError as exc:
        raise InputError(str(exc)) from None
    assert rdzv is not None
    return serve(rdzv)


def _with_tensor_parallel(
    args: argparse.Namespace, flags: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The context's features and sources with the run's tensor_parallel_size given."""
    from interlock.plugins.capabilities import TENSOR_PARALLEL

    features, sources = dict(flags["features"]), dict(flags["sources"])
    given = features.get(TENSOR_PARALLEL, args.tensor_parallel_size)
    if given != args.tensor_parallel_size:
        raise InputError(
            f"--feature {TENSOR_PARALLEL}={given} disagrees with --tensor-parallel-size "
            f"{args.tensor_parallel_size}; policy run splits the model as "
            "--tensor-parallel-size says, so give that alone"
        )
    features[TENSOR_PARALLEL] = args.tensor_parallel_size
    sources[f"features.{TENSOR_PARALLEL}"] = "given (--tensor-parallel-size)"
    return features, sources


def _step_tokens(prompts: list[Any]) -> int | None:
    """The most tokens one step of this run can hold (every prompt prefilled at once), when
    the prompts are token ids; None for text (its length is known only once tokenized)."""
    if any(isinstance(p, str) for p in prompts):
        return None
    return max(len(prompts), sum(len(p) for p in prompts))


def _cap_capture_sizes(decision: Any, steps: int) -> tuple[Any, Any]:
    """Keep the sizes a step of this run can pad to: those up to ``steps`` and the next one."""
    from dataclasses import replace

    from interlock.policy.trace import Step

    sizes = sorted(decision.capture_sizes)
    kept = [s for s in sizes if s < steps]
    kept += [s for s in sizes if s >= steps][:1]
    if len(kept) == len(sizes):
        return decision, None
    note = Step(
        stage="run",
        name="capture_sizes",
        sets={"capture_sizes": tuple(kept)},
        reason=f"this run's steps hold at most {steps} token(s): {len(sizes) - len(kept)} of "
        f"the {len(sizes)} capture sizes could never be used and are not captured",
    )
    return replace(decision, capture_sizes=tuple(kept)), note


def _output_dict(o: Any) -> dict[str, Any]:
    return {
        "prompt_token_ids": list(o.prompt_token_ids),
        "token_ids": list(o.token_ids),
        "text": o.text,
        "finish_reason": o.finish_reason,
    }


def _render_outputs(outputs: list[dict[str, Any]]) -> str:
    """Token-id prompts as ids (and text); text prompts as the reply's text, as it streams.
    Each text reply, and each run of token-id prompts, ends with a blank line."""
    lines: list[str] = []
    for i, out in enumerate(outputs):
        if "prompt" in out:
            lines += [_prompt_label(i, out["prompt"], out["chat"]), out["text"],
                      _finish_line(out["token_ids"], out["finish_reason"]), ""]
            continue
        lines += [f"[{i}] prompt {out['prompt_token_ids']}",
                  f"    -> {out['token_ids']} ({out['finish_reason']})"]
        if out["text"] is not None:
            lines.append(f"    text: {out['text']!r}")
        if i + 1 == len(outputs) or "prompt" in outputs[i + 1]:
            lines.append("")
    return "".join(line + "\n" for line in lines)


def _prompt_label(index: int, text: str, chat: bool) -> str:
    return f"[{index}] {'user' if chat else 'prompt'}: {text}"


def _finish_line(tokens: Any, reason: str | None) -> str:
    why = {"stop": "end of sequence", "length": "max tokens"}.get(reason or "", reason)
    return f"[{len(tokens)} tokens, {why}]"


class _Stream:
    """Writes the header, then each text prompt's reply as its tokens arrive, in prompt
    order: the first unfinished prompt live, each later one once those before it are done.
    Token-id prompts are shown with the metrics, at the end."""

    def __init__(self, out: Any, resolution: Any, provider: str, args: argparse.Namespace):
        self.out, self.resolution, self.provider = out, resolution, provider
        self.first = len(args.prompt_token_ids)
        self.labels = [_prompt_label(self.first + i, text, args.chat)
                       for i, text in enumerate(args.prompt)]
        self.tokens: list[tuple[int, ...]] = [()] * len(args.prompt)
        self.reasons: list[str | None] = [None] * len(args.prompt)
        self.turn = 0  # the prompt being shown
        self.shown: str | None = None  # its reply so far on the terminal (None: no label yet)

    def start(self, llm: Any) -> Any:
        """Write the header of the loaded model; returns the ``on_tokens`` callback."""
        self.llm = llm
        self.out.write(_header(self.resolution, self.provider, llm.report()) + "\n")
        self.out.flush()
        return self.on_tokens

    def on_tokens(self, index: int, tokens: tuple[int, ...], reason: str | None) -> None:
        index -= self.first
        if index < 0:
            return
        self.tokens[index], self.reasons[index] = tokens, reason
        while self.turn < len(self.tokens):
            i = self.turn
            if self.shown is None:
                self.out.write(self.labels[i] + "\n")
                self.shown = ""
            text = self.llm.decode(self.tokens[i])
            if self.reasons[i] is None:
                # An incomplete UTF-8 sequence decodes to U+FFFD until its last byte arrives.
                text = text.rstrip("\ufffd")
            if text.startswith(self.shown):
                self.out.write(text[len(self.shown):])
                self.shown = text
            if self.reasons[i] is None:
                break
            self.out.write("\n" + _finish_line(self.tokens[i], self.reasons[i]) + "\n\n")
            self.turn, self.shown = self.turn + 1, None
        self.out.flush()


def _document(
    resolution: Any,
    provider: str,
    outputs: Any,
    report: Any,
    metrics: dict[str, Any],
    trace: tuple[Any, ...],
    *,
    verbose: bool,
    prompts: list[str],
    chat: bool,
) -> dict[str, Any]:
    resolved = resolution.to_dict()
    graphs = report.graphs.to_dict() if report.graphs is not None else {}
    rows = [_output_dict(o) for o in outputs]
    for row, text in zip(rows[len(rows) - len(prompts):], prompts, strict=True):
        row["prompt"], row["chat"] = text, chat  # text prompts follow the token-id ones
    document: dict[str, Any] = {
        "decision": resolved["decision"],
        "provenance": resolved["provenance"],
        "context": resolved["context"],
        "runner": {
            "name": report.runner, "plugin": provider, "device": report.device,
            "dtype": report.dtype,
        },
        "outputs": rows,
        "metrics": metrics,
        "kernels": {k.op: k.implementation for k in report.kernels},
        "graphs": {**graphs, "fallbacks": list(report.fallbacks)},
        "tensor_parallel": asdict(report.tensor_parallel) if report.tensor_parallel else None,
    }
    if verbose:
        document["trace"] = [step.to_dict() for step in trace]
        document["kernel_choices"] = {
            k.op: {"implementation": k.implementation, "reason": k.reason} for k in report.kernels
        }
    return document


def _header(resolution: Any, provider: str, report: Any) -> str:
    """Which runner runs the model, and how (before the outputs, streamed or not)."""
    ctx, decision = resolution.context, resolution.decision
    graphs = report.graphs.to_dict() if report.graphs is not None else {}
    lines = [
        f"{ctx.architecture} on {ctx.platform}: runner {report.runner} from "
        f"plugin {provider}, {report.device}, {report.dtype}",
        f"graphs: cudagraph={decision.cudagraph} breakable={show_scalar(decision.breakable)} "
        f"compile={show_scalar(decision.compile)}; {_graph_summary(graphs)}",
    ]
    lines += [f"  fallback: {fallback}" for fallback in report.fallbacks]
    tp = report.tensor_parallel
    if tp is not None:
        lines.append(
            f"tensor parallel: {tp.size} ranks ({tp.backend}, {tp.launcher}), "
            f"{tp.heads_per_rank} attention head(s) and {tp.kv_heads_per_rank} KV head(s) "
            "per rank"
        )
        lines += [f"  {note}" for note in tp.notes]
    return "\n".join(lines) + "\n"


def _render_tail(doc: dict[str, Any], trace: tuple[Any, ...], *, verbose: bool) -> str:
    """The metrics (and with ``verbose`` the trace, kernels and graphs)."""
    from interlock.policy.explain import render_trace

    graphs, metrics = doc["graphs"], doc["metrics"]
    tpot = "-" if metrics["tpot_ms"] is None else f"{metrics['tpot_ms']:.2f} ms"
    lines = [
        f"ttft {metrics['ttft_ms']:.2f} ms, tpot {tpot}, {metrics['output_tokens']} tokens in "
        f"{metrics['generate_s']:.3f} s ({metrics['output_tokens_per_s']:.1f} tokens/s); "
        f"load {metrics['load_s']:.2f} s",
    ]
    if verbose:
        lines += ["", "trace", *render_trace(trace)]
        lines += ["", "kernels"]
        width = max(len(op) for op in doc["kernel_choices"])
        for op, choice in doc["kernel_choices"].items():
            lines.append(f"  {op:<{width}}  {choice['implementation']}  ({choice['reason']})")
        lines += ["", "graphs"]
        for name, sizes in graphs.get("sizes", {}).items():
            lines.append(f"  sizes {name}: {', '.join(map(str, sizes)) or '-'}")
        for graph in graphs.get("captured", []):
            lines.append(
                f"  captured {graph['key']}: {graph['segments']} segment(s), "
                f"{graph['breaks']} eager break(s)"
            )
        for key, why in graphs.get("failed", {}).items():
            lines.append(f"  failed {key}: {why}")
        for key, count in graphs.get("replays", {}).items():
            lines.append(f"  replayed {key}: {count} step(s)")
        for why, count in graphs.get("eager_steps", {}).items():
            lines.append(f"  eager: {why}: {count} step(s)")
    return "\n".join(lines) + "\n"


def _graph_summary(graphs: dict[str, Any]) -> str:
    if not graphs or graphs.get("backend") == "none":
        return "nothing to capture"
    captured = graphs["captured_sizes"]
    failed = len(graphs["failed"])
    sizes = ", ".join(map(str, captured)) or "none"
    return (
        f"{graphs['backend']} backend, captured sizes {sizes} in {graphs['capture_s']:.2f} s"
        + (f", {failed} capture(s) failed" if failed else "")
    )

