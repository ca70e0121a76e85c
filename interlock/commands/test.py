"""``policy test``: run declarative policy test cases, report each, and measure rule coverage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from interlock.commands.common import add_policy_args


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from interlock.policy.invariants import ALL_FLAG, SHOWN

    parser = subparsers.add_parser(
        "test",
        help="run policy test cases (policies.tests.yaml)",
        description="Run the cases of policy tests files against the policy: --policy when "
        "given, else the stack the tests file names (`policy: [\"@shipped\", site.yaml]`), "
        "else $INTERLOCK_POLICY, else the shipped one. Without FILES, the tests file beside "
        "the policy: X.tests.yaml for X.yaml. Prints each case, 'N passed, M failed' and rule "
        "coverage; a case whose architecture is not in the catalog gets a warning. Invariants "
        "are checked over the policy's whole finite domain, a violation shown as a "
        "counterexample: the context, its decision and the rule that decided it; the text "
        "report shows the simplest witness of each distinct violation first and at most "
        f"{SHOWN} per invariant, saying how many there are ({ALL_FLAG}: all). Exit 1 "
        "when a case or an invariant fails (or a case warns, under --strict) or a counted "
        "file's coverage is below --min-coverage (coverage is reported per file of a stack; "
        "every file but the shipped policy is counted, the shipped policy only alone).",
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="policy tests files")
    add_policy_args(parser)
    parser.add_argument(
        "--min-coverage",
        type=_percent,
        default=0.0,
        metavar="PCT",
        help="fail when fewer than PCT %% of the rules of a site file decided a field in "
        "some case: each file of the stack but the shipped policy, which counts only alone",
    )
    parser.add_argument("--strict", action="store_true", help="fail a case that warns")
    parser.add_argument(
        ALL_FLAG,
        action="store_true",
        help=f"show every counterexample of a failing invariant, not the first {SHOWN} "
        "(--json always lists all)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(run=run)


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage 0-100, got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentage 0-100, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from interlock.commands.common import load, write_json
    from interlock.core.errors import PolicyError
    from interlock.core.terminal import use_color
    from interlock.plugins.capabilities import capabilities_for
    from interlock.policy.invariants import SHOWN, check_invariants
    from interlock.policy.loader import load_policy_sources, policy_paths, read_source
    from interlock.policy.policytest import (
        TestRun,
        coverage_to_dict,
        render_result,
        render_summary,
        run_cases,
    )
    from interlock.policy.testfile import load_tests, tests_path_for
    from interlock.vllm.stage import decide_with_release

    paths = [Path(f) for f in args.files]
    if not paths:
        name, path = policy_paths(args.policy)[-1]
        default = tests_path_for(path)
        if not default.is_file():
            raise PolicyError(f"no tests file beside the policy {name}: expected {default}")
        paths = [_relative(default)]
    # Cases grouped by the policy they test: --policy for all, else each file's own stack.
    groups: dict[tuple[tuple[str, Path], ...] | None, tuple[list[Any], list[Any]]] = {}
    for path in paths:
        tests = load_tests(path)
        key = None if args.policy else tests.policy
        cases, invariants = groups.setdefault(key, ([], []))
        cases.extend(tests.cases)
        invariants.extend(tests.invariants)
    runs: list[TestRun] = []
    checked: list[list[Any]] = []
    for key, (cases, invariants) in groups.items():
        if key is None:
            policy = load(args)
        else:
            policy = load_policy_sources([(name, read_source(p, name)) for name, p in key])
        runs.append(run_cases(policy, cases, decide=decide_with_release))
        checked.append(check_invariants(policy, invariants, capabilities=capabilities_for(policy)))
    failed = sum(run.failed for run in runs) + sum(
        not r.passed for results in checked for r in results
    )
    warned = sum(bool(r.warnings) for run in runs for r in run.results if r.passed)
    if args.strict:
        failed += warned
    below = [f for run in runs for f in run.below(args.min_coverage)]
    if args.json:
        write_json(_document(runs, checked, args, failed, below, coverage_to_dict))
    else:
        color = use_color(sys.stdout)
        for run, results in zip(runs, checked, strict=True):
            if len(runs) > 1:
                print(f"policy {' + '.join(f.path for f in run.policy.files)}:")
            for result in run.results:
                print("\n".join(render_result(result, color=color)))
            limit = None if args.all_counterexamples else SHOWN
            for invariant in results:
                print("\n".join(invariant.render(limit=limit)))
            print("\n".join(render_summary(run, results)))
        if warned and args.strict:
            print(f"policy: error: {warned} case(s) warn, and --strict fails them",
                  file=sys.stderr)
    for file in below:
        print(
            f"policy: error: rule coverage of {file.file} is {file.percent:.1f} %, below "
            f"--min-coverage {args.min_coverage:g} %",
            file=sys.stderr,
        )
    return 1 if failed or below else 0


def _document(
    runs: list[Any],
    checked: list[list[Any]],
    args: argparse.Namespace,
    failed: int,
    below: list[Any],
    coverage: Any,
) -> dict[str, Any]:
    from interlock.policy.policytest import result_to_dict

    return {
        "ok": not failed and not below,
        "passed": sum(run.passed for run in runs)
        + sum(r.passed for results in checked for r in results),
        "failed": failed,
        "strict": args.strict,
        "min_coverage": args.min_coverage,
        "runs": [
            {
                "policy": {
                    "files": [f.path for f in run.policy.files],
                    "version": run.policy.version,
                    "revision": run.policy.revision,
                },
                "cases": [result_to_dict(r) for r in run.results],
                "invariants": [r.to_dict() for r in results],
                "coverage": coverage(run),
            }
            for run, results in zip(runs, checked, strict=True)
        ],
    }


def _relative(path: Path) -> Path:
    """``path`` relative to the current directory when it is below it (shorter locations)."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path
