"""``policy diff OLD NEW``: every decision that changes between two policies, grouped by change.

OLD and NEW are policy stacks written as ``INTERLOCK_POLICY`` writes them
(``policies.yaml:site.yaml``, with ``@shipped`` for the shipped policy), so
``policy diff @shipped @shipped:site.yaml`` is what layering site.yaml changes;
or git revisions: ``git:REV`` is the repository's ``policies.yaml`` at REV,
``git:REV:path`` another file (relative to the repository root). The repository
is the one holding the current directory; a ``git:`` side is one file, not a stack.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.commands.common import percent, positive, write_json
from interlock.commands.measure.flags import add_engine_args, add_workload_args
from interlock.core.errors import PolicyError
from interlock.policy.diff import MAX_CONTEXTS

if TYPE_CHECKING:
    from interlock.policy.context import Context
    from interlock.policy.diff import PolicyDiff
    from interlock.policy.model import Policy
    from interlock.policy.resolution import Resolution

GIT_PREFIX = "git:"
DEFAULT_GIT_PATH = "policies.yaml"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="what changes between two policies, exhaustively",
        description="Resolve both policies on every context of their common finite domain "
        "(catalog architectures x platforms x device archs they mention, plus one unnamed per "
        "platform, x feature values x env states) and print the decisions that differ, grouped "
        "by change, with the rule that decided each side. When they agree, prints 'no decision "
        "differs over N contexts' and exits 0.",
    )
    for side in ("old", "new"):
        parser.add_argument(
            side, metavar=side.upper(),
            help="policy file or stack (a.yaml:b.yaml, @shipped the shipped policy), "
            "git:REV or git:REV:path",
        )
    parser.add_argument("--json", action="store_true", help="print the changes as JSON")
    parser.add_argument(
        "--exit-code", action="store_true", help="exit 1 when the policies differ (for CI)"
    )
    parser.add_argument(
        "--fields",
        type=_fields,
        metavar="F,...",
        help="compare only these decision fields (default: all)",
    )
    parser.add_argument(
        "--max-contexts", dest="max_contexts", type=positive, default=MAX_CONTEXTS, metavar="N",
        help=f"refuse (exit 1, naming the size) a domain of more than N contexts (default "
        f"{MAX_CONTEXTS:,}; each costs a match per policy)",
    )
    measure = parser.add_argument_group(
        "measuring (--measure)",
        "benchmark the old and new decisions for --model on this machine, side by side",
    )
    measure.add_argument(
        "--measure", action="store_true",
        help="measure each changed decision that runs here (needs --model)",
    )
    measure.add_argument("--model", metavar="PATH|demo", help="the model to measure")
    measure.add_argument(
        "--max-regression", type=percent, metavar="PCT",
        help="exit 1 when a measured TPOT change is a significant regression beyond PCT %%",
    )
    add_workload_args(measure)
    measure.add_argument("--platform", help="with --engine vllm: the platform vLLM runs on "
                         "(default: detected)")
    measure.add_argument("--device-arch", dest="device_arch", metavar="ARCH",
                         help="with --engine vllm: e.g. sm_90 or gfx950")
    add_engine_args(parser)
    parser.set_defaults(run=run)


def _fields(text: str) -> list[str]:
    """Field names of some engine's vocabulary (the policies' is checked once they are
    read)."""
    from interlock.core.decision import DECISION_FIELDS, VOCABULARIES

    names = [part.strip() for part in text.split(",") if part.strip()]
    known = {n for v in VOCABULARIES.values() for n in v.names}
    for name in names:
        if name not in known:
            raise argparse.ArgumentTypeError(
                f"unknown decision field {name!r}; allowed: {', '.join(DECISION_FIELDS)}"
            )
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of decision fields")
    return names


def run(args: argparse.Namespace) -> int:
    from interlock.policy.diff import diff_policies, render_text, to_json
    from interlock.policy.loader import load_policy_sources

    old = load_policy_sources(read_policy_arg(args.old))
    new = load_policy_sources(read_policy_arg(args.new))
    if args.measure and old.engine != "vllm":
        raise PolicyError(f"--measure runs interlock's runners or vLLM; these policies decide "
                          f"for {old.vocabulary.title}")
    if args.measure and args.model is None:
        raise PolicyError("--measure needs --model PATH|demo: the model to run the decisions on")
    if not args.measure and (args.model is not None or args.max_regression is not None):
        raise PolicyError("--model and --max-regression only apply with --measure")
    if args.engine == "interlock":
        raise PolicyError("--engine interlock: policy diff --measure runs interlock's runners "
                          "in this process; leave --engine out (or use --engine vllm)")
    if args.engine != "vllm" and (args.platform or args.device_arch):
        raise PolicyError("--platform and --device-arch apply to --engine vllm: interlock's "
                          "runners measure on this machine")
    diff = diff_policies(old, new, args.fields or None, args.max_contexts)
    measured = _measure(args, old, new, diff) if args.measure else None
    if args.json:
        document = to_json(diff, old, new)
        if measured is not None:
            document["measure"] = measured
        write_json(document)
    else:
        sys.stdout.write(render_text(diff))
        if measured is not None:
            sys.stdout.write(_measure_text(measured))
    if measured is not None and measured["regressions"]:
        return 1
    return 1 if args.exit_code and not diff.equal else 0


def _measure(args: argparse.Namespace, old: Policy, new: Policy, diff: PolicyDiff
             ) -> dict[str, Any]:
    """Benchmark the decisions both policies make for --model here, when they differ; list
    the changed contexts this machine cannot measure, grouped by why."""
    from interlock.commands.measure.orchestrate import workload_of
    from interlock.commands.measure.output import command_line, progress_bar
    from interlock.core.platform import detect_platform
    from interlock.measure import compare

    words = ("diff", args.old, args.new, "--measure", "--model", args.model)
    if args.engine == "vllm":
        before, after, record = _measure_engine(args, old, new, words)
        here = before.context.platform
    else:
        workload = workload_of(args)
        bar = progress_bar()
        try:
            before, after, record = compare(
                args.model, old, new, workload=workload, dtype=args.dtype,
                load_format=args.load_format, progress=bar,
                command=command_line(words, args), settings=args.settings,
            )
        finally:
            if bar is not None:
                bar.close()
        here = detect_platform()[0]
    arch = before.context.architecture
    unmeasured: dict[str, set[Any]] = {}
    for change in diff.changes:
        reason = _unmeasured(change.context, arch, here)
        if reason is not None:
            unmeasured.setdefault(reason, set()).add(change.context)
    result: dict[str, Any] = {
        "model": args.model,
        "architecture": arch,
        "platform": here,
        "old": before.decision.to_dict(),
        "new": after.decision.to_dict(),
        "max_regression_pct": args.max_regression,
        "unmeasured": [
            {"reason": reason, "contexts": len(contexts)}
            for reason, contexts in unmeasured.items()
        ],
        "regressions": [],
    }
    if record is None:
        result["measured"] = None
        return result
    entries = []
    for batch, entry in record["analysis"]["batch_sizes"].items():
        [effect] = [e for e in entry["effects"]["tpot_ms"] if e["factors"] == ["policy"]]
        base = entry["configurations"]["old"]["tpot_ms"]["value"]
        pct = 100 * effect["value"] / base if base else 0.0
        regression = (
            args.max_regression is not None and effect["significant"] and effect["low"] > 0
            and pct > args.max_regression
        )
        entries.append(
            {
                "batch_size": int(batch),
                "old_tpot_ms": entry["configurations"]["old"]["tpot_ms"],
                "new_tpot_ms": entry["configurations"]["new"]["tpot_ms"],
                "delta_ms": {k: effect[k] for k in ("value", "low", "high", "significant")},
                "delta_pct": round(pct, 2),
                "regression": regression,
            }
        )
    result["measured"] = entries
    result["regressions"] = [e["batch_size"] for e in entries if e["regression"]]
    if "accuracy" in record:  # on vLLM: the new decision's answers against the old one's
        result["accuracy"] = record["accuracy"]["cells"]["new"]
        if args.fail_on_divergence and record["accuracy"]["flagged"]:
            result["regressions"].append("accuracy")
    result["record"] = str(_keep(record))
    return result


def _measure_engine(
    args: argparse.Namespace, old: Policy, new: Policy, words: tuple[str, ...]
) -> tuple[Resolution, Resolution, dict[str, Any] | None]:
    """``--engine vllm``: the old and new decisions for --model as two cells on `vllm serve`
    (none when vLLM would be started alike)."""
    from interlock.app.query import Query
    from interlock.commands.measure.engines import engine_setup, measure_on_engine
    from interlock.commands.measure.output import command_line
    from interlock.measure.vllm_serve import compare_cells

    setup = engine_setup(args, Query(platform=args.platform, device_arch=args.device_arch))
    before, after, cells = compare_cells(old, new, setup.query, setup.model, args.vllm_arg,
                                         setup.detected)
    if not cells:
        return before, after, None
    record = measure_on_engine(
        args, setup, before, cells, [], {"policy": ["old", "new"]},
        {"old": old.stamp(), "new": new.stamp()},
        command_line((*words[:-2], "--engine", "vllm", *words[-2:]), args),
    )
    return before, after, record


def _unmeasured(context: Context, architecture: str, here: str) -> str | None:
    """Why a changed context cannot be measured by running the model here (None: it can)."""
    if context.platform != here:
        return f"on {context.platform}: this machine is {here}"
    if context.architecture != architecture:
        return f"for architectures other than the model's ({architecture})"
    if context.env:
        return "with an env binding set (the measurement runs with none set)"
    if context.device_arch:
        return f"device arch {context.device_arch}: not this machine's"
    if context.features:
        return "with deployment features this run does not have"
    return None


def _keep(record: dict[str, Any]) -> Path:
    from interlock.commands.measure.output import write_record

    return write_record(record, None)


def _measure_text(measured: dict[str, Any]) -> str:
    from interlock.core.fields import show_scalar

    def shown(decision: dict[str, Any]) -> str:
        return " ".join(
            f"{k}={show_scalar(decision[k])}" for k in ("runner", "cudagraph", "breakable")
        )

    lines = ["", f"measured: {measured['architecture']} ({measured['model']}) on "
             f"{measured['platform']}, env bindings unset"]
    if measured["measured"] is None:
        lines.append(
            f"  old and new decide alike here ({shown(measured['new'])}): nothing to measure"
        )
    else:
        lines.append(f"  old: {shown(measured['old'])}")
        lines.append(f"  new: {shown(measured['new'])}")
        for entry in measured["measured"]:
            d = entry["delta_ms"]
            verdict = "significant" if d["significant"] else "not significant"
            if entry["regression"]:
                verdict += f", a regression beyond {measured['max_regression_pct']:g} %"
            lines.append(
                f"  batch {entry['batch_size']}: TPOT {entry['old_tpot_ms']['value']:.2f} -> "
                f"{entry['new_tpot_ms']['value']:.2f} ms/token: {d['value']:+.2f} "
                f"[{d['low']:+.2f}, {d['high']:+.2f}] ({entry['delta_pct']:+.1f} %), {verdict}"
            )
        accuracy = measured.get("accuracy")
        if accuracy is not None:
            mark = ": DIVERGES" if accuracy["flagged"] else ""
            lines.append(f"  accuracy: the new decision's greedy outputs differ from the old "
                         f"one's on {100 * accuracy['divergence']:.0f} % of the prompts{mark}")
        lines.append(f"  record: {measured['record']}")
    for item in measured["unmeasured"]:
        lines.append(f"unmeasured: {item['contexts']} changed context(s) {item['reason']}")
    return "\n".join(lines) + "\n"


def read_policy_arg(spec: str) -> list[tuple[str, bytes]]:
    """``(display name, content)`` of each file of a policy stack, or of a ``git:REV[:path]``
    revision."""
    if not spec.startswith(GIT_PREFIX):
        from interlock.policy.loader import parse_stack, read_source

        return [(name, read_source(path, name)) for name, path in parse_stack(spec, "policy diff")]
    rev, _, path = spec[len(GIT_PREFIX) :].partition(":")
    if not rev:
        raise PolicyError(f"{spec!r}: expected git:REV or git:REV:path, e.g. git:HEAD~1")
    if rev.startswith("-") or any(c.isspace() or not c.isprintable() for c in rev):
        # It reaches `git show` as an argument: `git:--output=FILE` would write a file.
        raise PolicyError(
            f"{spec!r}: {rev!r} is not a revision (it may not start with '-' or hold spaces "
            "or control characters); e.g. git:HEAD~1 or git:origin/main"
        )
    path = path or DEFAULT_GIT_PATH
    parts = Path(path).parts
    if Path(path).is_absolute() or ".." in parts or "\0" in path:
        raise PolicyError(
            f"{spec!r}: the path {path!r} must be relative to the repository root, without '..'"
        )
    return [(f"{rev}:{path}", _git_show(rev, path, spec))]


def _git_show(rev: str, path: str, spec: str) -> bytes:
    from interlock.core.git import run_git
    from interlock.policy.loader import MAX_FILE_BYTES

    try:
        done = run_git(["show", "--no-textconv", "--no-ext-diff", f"{rev}:{path}"], timeout=60)
    except FileNotFoundError:
        raise PolicyError(f"{spec}: git is not installed") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PolicyError(f"{spec}: git show {rev}:{path} failed: {exc}") from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        raise PolicyError(f"{spec}: git show {rev}:{path} failed: {message}")
    if len(done.stdout) > MAX_FILE_BYTES:
        raise PolicyError(f"policy file is larger than the {MAX_FILE_BYTES} byte limit", file=spec)
    return done.stdout
