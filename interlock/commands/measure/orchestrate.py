"""``policy measure``'s run: the design measured in this process (``--engine`` left out), on
``vllm serve`` (``--engine vllm``) or on ``policy serve`` (``--engine interlock``); the record
written and shown."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from interlock.commands.common import load, query_of, write_json
from interlock.commands.measure.engines import engine_setup, engine_workload, measure_on_engine
from interlock.commands.measure.output import command_line, progress_bar, write_record
from interlock.core.errors import InputError

if TYPE_CHECKING:
    from interlock.measure import Workload


def run(args: argparse.Namespace) -> int:
    from interlock.app.query import model_target
    from interlock.core.decision import parse_field
    from interlock.core.errors import PolicyError
    from interlock.measure import design_factors, measure_query

    vary: dict[str, list[Any]] = {}
    for name, levels in args.vary:
        if name in vary:
            raise PolicyError(f"--vary {name} is given twice; list all its levels in one")
        try:
            vary[name] = [parse_field(name, level) for level in levels]
        except ValueError as exc:
            raise PolicyError(f"--vary {exc}") from None
    if args.engine == "vllm":
        return _run_engine(args, vary)
    if args.engine == "interlock":
        return _run_serve(args, vary)
    workload = workload_of(args)
    policy = load(args)
    query = query_of(args, policy, model=None, runs_here=True)
    factors = design_factors(vary, query.overrides)
    query = replace(query, model=model_target(args.model))
    bar = progress_bar()
    try:
        record = measure_query(
            policy, query, args.model, factors, workload=workload, dtype=args.dtype,
            load_format=args.load_format, progress=bar,
            command=command_line(("measure", args.model), args), settings=args.settings,
        )
    finally:
        if bar is not None:
            bar.close()
    return _finish(args, record)


def _finish(args: argparse.Namespace, record: dict[str, Any]) -> int:
    """Write the record (and the plot), print it; for an engine record, the accuracy gate's
    exit status."""
    from interlock.measure.pick import beaten
    from interlock.measure.render import contradiction_text, render_text

    path = write_record(record, args.record)
    if args.plot:
        from interlock.measure.plot import write_plot

        try:
            write_plot(record, args.plot)
        except OSError as exc:
            raise InputError(f"--plot {args.plot}: cannot write it: {exc.strerror}") from None
    if args.json:
        write_json(record)
    else:
        sys.stdout.write(render_text(record))
        sys.stdout.write(contradiction_text(record, path, kept=args.record is not None))
        if args.plot:
            print(f"plot: {args.plot}")
    sys.stdout.flush()
    print(f"record: {path}", file=sys.stderr)
    flagged = (record.get("accuracy") or {}).get("flagged") or []
    loses = bool(beaten(record)) and args.fail_if_pick_loses
    if loses:
        print("policy: error: a measured alternative beats the policy's pick significantly, "
              "and --fail-if-pick-loses fails it", file=sys.stderr)
    return 1 if (flagged and args.fail_on_divergence) or loses else 0


def _run_engine(args: argparse.Namespace, vary: dict[str, list[Any]]) -> int:
    """``--engine vllm``: the cells on `vllm serve` (interlock.measure.vllm_serve)."""
    from interlock.core.errors import PolicyError
    from interlock.measure.pick import policy_pick
    from interlock.measure.vllm_serve import resolve_cells

    policy = load(args)
    setup = engine_setup(args, query_of(args, policy, model=None))
    base, cells, skipped = resolve_cells(policy, setup.query, setup.model, vary,
                                         args.vllm_arg, setup.detected, setup.triton)
    if not cells:
        raise PolicyError("--engine vllm: every cell was refused: "
                          + "; ".join(s["reason"] for s in skipped))
    record = measure_on_engine(
        args, setup, base, cells, skipped, vary, policy.stamp(),
        command_line(("measure", "--engine", "vllm", args.model), args),
        pick=policy_pick(base, [(c.id, c.resolution) for c in cells], list(vary)),
    )
    return _finish(args, record)


def _run_serve(args: argparse.Namespace, vary: dict[str, list[Any]]) -> int:
    """``--engine interlock``: the cells on `policy serve` (interlock.measure.policy_serve)."""
    from interlock.core.errors import PolicyError
    from interlock.measure.pick import policy_pick
    from interlock.measure.policy_serve import measure_serve, serve_cells

    if args.vllm_arg or args.vllm_version:
        raise PolicyError("--vllm-arg and --vllm-version apply to --engine vllm")
    policy = load(args)
    query = query_of(args, policy, runs_here=True)
    passed: list[str] = []
    for path in args.policy or ():
        passed += ["--policy", str(path)]
    for flag in ("feature", "env"):
        for key, value in getattr(args, flag):
            passed += [f"--{flag}", f"{key}={value}"]
    if args.decision_log:  # each server appends its record; the variable reaches them as is
        passed += ["--decision-log", args.decision_log]
    base, cells, skipped = serve_cells(policy, query, args.model, vary, passed)
    if not cells:
        raise PolicyError("--engine interlock: every cell was refused: "
                          + "; ".join(s["reason"] for s in skipped))
    workload, prompts, answers = engine_workload(args)
    bar = progress_bar()
    try:
        record = measure_serve(
            args.model, base, cells, skipped, vary, workload, policy=policy.stamp(),
            accuracy_prompts=prompts, accuracy_answers=answers,
            startup_timeout=args.startup_timeout, port=args.port, progress=bar,
            command=command_line(("measure", "--engine", "interlock", args.model), args),
            pick=policy_pick(base, [(c.id, c.resolution) for c in cells], list(vary)),
        )
    finally:
        if bar is not None:
            bar.close()
    return _finish(args, record)


def workload_of(args: argparse.Namespace) -> Workload:
    """The ``Workload`` the flags of
    :func:`~interlock.commands.measure.flags.add_workload_args` describe (torch threads set)."""
    from interlock.measure import Workload

    workload = Workload(
        batch_sizes=args.batch_sizes, prompt_len=args.prompt_len, prompt=args.prompt,
        max_tokens=args.max_tokens, trials=args.trials, warmup=args.warmup, seed=args.seed,
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    return workload
