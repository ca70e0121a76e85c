"""``policy run``'s output: the JSON document, and the text a terminal shows (the header,
the outputs, the metrics and with ``--verbose`` the trace, kernels and graphs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from interlock.core.fields import show_scalar

if TYPE_CHECKING:
    from interlock.app.outputs import RequestOutput
    from interlock.policy.resolution import Resolution
    from interlock.policy.trace import Step
    from interlock.runners.contract import KVCacheReport, RunnerReport


def output_dict(o: RequestOutput) -> dict[str, Any]:
    return {
        "prompt_token_ids": list(o.prompt_token_ids),
        "token_ids": list(o.token_ids),
        "text": o.text,
        "finish_reason": o.finish_reason,
    }


def render_outputs(outputs: list[dict[str, Any]]) -> str:
    """Token-id prompts as ids (and text); text prompts as the reply's text, as it streams.
    Each text reply, and each run of token-id prompts, ends with a blank line."""
    lines: list[str] = []
    for i, out in enumerate(outputs):
        if "prompt" in out:
            lines += [prompt_label(i, out["prompt"], out["chat"]), out["text"],
                      finish_line(out["token_ids"], out["finish_reason"]), ""]
            continue
        lines += [f"[{i}] prompt {out['prompt_token_ids']}",
                  f"    -> {out['token_ids']} ({out['finish_reason']})"]
        if out["text"] is not None:
            lines.append(f"    text: {out['text']!r}")
        if i + 1 == len(outputs) or "prompt" in outputs[i + 1]:
            lines.append("")
    return "".join(line + "\n" for line in lines)


def prompt_label(index: int, text: str, chat: bool) -> str:
    return f"[{index}] {'user' if chat else 'prompt'}: {text}"


def finish_line(tokens: Sequence[int], reason: str | None) -> str:
    why = {"stop": "end of sequence", "length": "max tokens"}.get(reason or "", reason)
    return f"[{len(tokens)} tokens, {why}]"


def run_document(
    resolution: Resolution,
    provider: str,
    outputs: Sequence[RequestOutput],
    report: RunnerReport,
    metrics: dict[str, Any],
    trace: tuple[Step, ...],
    *,
    verbose: bool,
    prompts: list[str],
    chat: bool,
) -> dict[str, Any]:
    resolved = resolution.to_dict()
    graphs = report.graphs.to_dict() if report.graphs is not None else {}
    rows = [output_dict(o) for o in outputs]
    # Each request's clock readings, from the run's first arrival: what the metrics are
    # computed from (interlock.app.timing), so that any reader can recompute them.
    times = [o.times for o in outputs]
    origin = min((t.arrival for t in times if t is not None), default=0.0)
    for row, t in zip(rows, times, strict=True):
        row["times_s"] = None if t is None else {
            "arrival": round(t.arrival - origin, 6),
            "first_token": round(t.first_token - origin, 6),
            "finish": round(t.finish - origin, 6)}
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
        "kv_cache": asdict(report.kv_cache) if report.kv_cache else None,
    }
    if verbose:
        document["trace"] = [step.to_dict() for step in trace]
        document["kernel_choices"] = {
            k.op: {"implementation": k.implementation, "reason": k.reason} for k in report.kernels
        }
    return document


def header(resolution: Resolution, provider: str, report: RunnerReport) -> str:
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
        lines.append(f"  collectives: {tp.collectives}")
        lines += [f"  {note}" for note in tp.notes]
    if report.kv_cache is not None:
        lines.append(kv_cache_line(report.kv_cache))
    return "\n".join(lines) + "\n"


def kv_cache_line(kv: KVCacheReport) -> str:
    """``kv cache: MLA latent, 192 bytes/token (per-head K/V: 896, 4.7x); 384 tokens``."""
    line = f"kv cache: {kv.layout}, {kv.bytes_per_token} bytes/token"
    if kv.per_head_bytes_per_token != kv.bytes_per_token:
        ratio = kv.per_head_bytes_per_token / kv.bytes_per_token
        line += f" (per-head K/V would take {kv.per_head_bytes_per_token}: {ratio:.1f}x)"
    line += f"; {kv.num_blocks} blocks of {kv.block_size} = {kv.tokens} tokens"
    linear = getattr(kv, "linear_layers", ())
    if linear:
        line += (f"\nrecurrent state: linear-attention layers {', '.join(map(str, linear))}, "
                 f"{kv.state_bytes_per_request} bytes/request in {kv.state_slots} slots")
    return line


def render_tail(doc: dict[str, Any], trace: tuple[Step, ...], *, verbose: bool) -> str:
    """The metrics (and with ``verbose`` the trace, kernels and graphs)."""
    from interlock.policy.explain import render_trace

    graphs, metrics = doc["graphs"], doc["metrics"]
    def shown(key: str, unit: str, digits: int = 2) -> str:
        return "-" if metrics[key] is None else f"{metrics[key]:.{digits}f}{unit}"

    lines = [
        f"ttft {shown('ttft_ms', ' ms')}, tpot {shown('tpot_ms', ' ms')}, "
        f"{metrics['output_tokens']} tokens in {metrics['generate_s']:.3f} s "
        f"({shown('output_tokens_per_s', ' tokens/s', 1)}); "
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
        for point in graphs.get("break_points", []):
            lines.append(f"  break point {point}")
        if graphs.get("buffers"):
            lines.append(f"  {graphs['buffers']}")
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
