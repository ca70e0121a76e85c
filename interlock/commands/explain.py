"""``policy explain``: the decision, who set each field, and the trace of every rule."""

from __future__ import annotations

import argparse
import sys

from interlock.commands.common import add_decision_command, refused_exit, resolve_args


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_decision_command(
        subparsers, "explain", "explain the decision for an architecture",
        "The decision for ARCH, each field with the rule (id, file:line, reason) that set it, "
        "and the trace of every rule, matched or not.",
    )
    parser.add_argument("--json", action="store_true", help="print the `policy resolve` document")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.commands.release_check import warn_outside
    from interlock.core import terminal
    from interlock.policy import explain

    resolution = resolve_args(args)
    context = resolution.context
    if resolution.policy.engine == "vllm":  # the releases interlock has read are vLLM's
        warn_outside("policy explain", resolution.policy, context.engine.get("vllm"),
                     context.source("engine.vllm"))
    if args.json:
        sys.stdout.write(explain.render_json(resolution))
    else:
        sys.stdout.write(explain.render_text(resolution, color=terminal.use_color(sys.stdout)))
    return refused_exit(resolution)
