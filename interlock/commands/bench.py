"""``policy bench MODEL``: measure a model under several decisions, side by side.

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
import shlex
import sys
from collections.abc import Sequence
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
from interlock.core.decision import DTYPE_CHOICES, LOAD_FORMATS
from interlock.core.errors import InputError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure a model under several decisions (factorial, with confidence intervals)",
        description="Run MODEL through the runner plugins under every combination of the "
        "--vary levels (the other fields as the policy decides here), interleaving trials in "
        "blocks, and report per-configuration medians with bootstrap 95 % intervals, the 2^k "
        "main effects and interactions, and the fastest configuration. Exit 0 ok, 1 policy, "
        "model or input error, 2 usage error.",
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
    parser.set_defaults(run=run)


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """What each trial runs, and how the model loads (shared with ``policy diff --measure``)."""
    parser.add_argument(
        "--batch-sizes", type=_sizes, default=(1,), metavar="1,8",
        help="batch sizes to measure each configuration at (default: 1)",
    )
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt-len", type=_positive, default=16, metavar="N",
        help="prompt length in tokens (default: 16)",
    )
    prompt.add_argument("--prompt", metavar="TEXT", help="a text prompt (needs tokenizer.json)")
    parser.add_argument(
        "--max-tokens", type=_positive, default=32, metavar="N",
        help="tokens generated per sequence (default: 32)",
    )
    parser.add_argument(
        "--trials", type=_positive, default=5, metavar="K", help="measured blocks (default: 5)"
    )
    parser.add_argument(
        "--warmup", type=_natural, default=1, metavar="W",
        help="warm-up blocks, run and recorded but not analysed (default: 1)",
    )
    parser.add_argument("--seed", type=int, default=0, help="order and bootstrap seed")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="model dtype")
    parser.add_argument(
        "--load-format", choices=LOAD_FORMATS, default="auto",
        help="weights: the checkpoint's, or seeded dummy values (speed does not depend on them)",
    )
    parser.add_argument(
        "--threads", type=_positive, metavar="N",
        help="torch CPU threads (default: torch's; 1 is steadier on a busy machine)",
    )


def command_line(words: Sequence[str], args: argparse.Namespace) -> str:
    """The command as a record keeps it: ``policy`` and ``words`` (e.g. ``bench MODEL``),
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


def workload_of(args: argparse.Namespace) -> Any:
    """The ``Workload`` the flags of :func:`add_workload_args` describe (torch threads set)."""
    from interlock.bench import Workload

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


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return int(text)


def _natural(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 0")
    return int(text)


def run(args: argparse.Namespace) -> int:
    from interlock.bench import run as bench_run
    from interlock.bench.render import render_text
    from interlock.core.decision import parse_field
    from interlock.core.errors import PolicyError

    vary: dict[str, list[Any]] = {}
    for name, levels in args.vary:
        if name in vary:
            raise PolicyError(f"--vary {name} is given twice; list all its levels in one")
        try:
            vary[name] = [parse_field(name, level) for level in levels]
        except ValueError as exc:
            raise PolicyError(f"--vary {exc}") from None
    workload = workload_of(args)
    policy = load(args)
    flags = context_flags_of(args, policy)
    bar = progress_bar()
    try:
        record = bench_run(
            args.model, vary=vary, workload=workload, policy=args.policy,
            platform=flags["platform"], device_arch=flags["device_arch"],
            features=flags["features"], env={k: v for k, v in args.env},
            overrides=overrides_of(args), dtype=args.dtype, load_format=args.load_format,
            progress=bar, command=command_line(("bench", args.model), args),
        )
    finally:
        if bar is not None:
            bar.close()
    path = write_record(record, args.record)
    if args.plot:
        from interlock.bench.plot import write_plot

        try:
            write_plot(record, args.plot)
        except OSError as exc:
            raise InputError(f"--plot {args.plot}: cannot write it: {exc.strerror}") from None
    if args.json:
        write_json(record)
    else:
        sys.stdout.write(render_text(record))
        if args.plot:
            print(f"plot: {args.plot}")
    sys.stdout.flush()
    print(f"record: {path}", file=sys.stderr)
    return 0


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
        target = str(cache / "bench" / f"{stamp}-{record['model']['architecture']}.json")
    path = Path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
    except OSError as exc:
        raise InputError(f"--record {target}: cannot write the record: {exc.strerror}") from None
    return path


class _Bar:
    """A tqdm bar on stderr, driven by ``interlock.bench.run``'s ``progress(done, total)``."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="bench", unit="trial", file=_terminal())
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
