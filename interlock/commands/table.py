"""``policy table``: the decision for every catalog architecture on every platform."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from interlock.commands.common import (
    add_engine_args,
    add_env_args,
    add_policy_args,
    engine_of,
    engine_version,
    env_of,
    load,
    pair,
    positive,
)
from interlock.core.platform import PLATFORM_NAMES
from interlock.policy.model import Policy

#: The most rows (architectures x platforms x config states) ``policy table`` resolves unless
#: told otherwise (``--max-contexts``): about 20,000 take seconds on a 2-core machine.
MAX_ROWS = 20_000

if TYPE_CHECKING:
    from interlock.policy.fleet import Target


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "table",
        help="decision matrix: catalog architectures x platforms, or x your fleet's targets",
        description="The decision (policy stages and runner capabilities) for every catalog "
        "architecture on each platform (--device-arch and --feature apply to every context). "
        "With --target P:ARCH (repeatable, e.g. --target cuda:sm_90 --target rocm:gfx950), a "
        "fleet view: rows are architectures, columns the targets, each cell the decision (a "
        "target's @vllm=X decides its column for that release: one table across releases); on "
        "a layered policy (@shipped:site.yaml) the cells the last file changes against the "
        "layers below it are marked (--against STACK names another base). When the policy "
        "has config conditions, one row per distinct truth assignment of its config "
        "predicates (and one with no model config), as `policy diff` enumerates them. The "
        "process environment is not applied; pass --env to apply a binding; "
        "--engine-version gives the engine version.",
    )
    parser.add_argument(
        "--platform",
        action="append",
        metavar="P",
        help=f"platform to include; repeatable (default: {', '.join(PLATFORM_NAMES)} and any a "
        "rule names)",
    )
    parser.add_argument(
        "--device-arch", dest="device_arch", metavar="ARCH",
        help="device arch of every --platform context, e.g. gfx950",
    )
    parser.add_argument(
        "--target", action="append", type=_target, metavar="P[:ARCH][@vllm=X]",
        help="a column of the fleet view: platform, device arch and, after @, the engine "
        "release the column is decided for (over --engine-version), e.g. rocm:gfx950 or "
        "rocm:gfx942@vllm=0.31.0; repeatable",
    )
    parser.add_argument(
        "--architecture", "-a", action="append", metavar="NAME|GLOB",
        help="rows to show: an architecture or a glob (Glm*); repeatable (default: the catalog)",
    )
    parser.add_argument(
        "--feature", action="append", type=pair, default=[], metavar="K=V",
        help="deployment feature of every context, e.g. tensor_parallel_size=8",
    )
    parser.add_argument(
        "--against", metavar="STACK",
        help="the base policy changed cells are marked against (default: for a layered "
        "policy, its layers below the last)",
    )
    parser.add_argument(
        "--max-contexts", dest="max_contexts", type=positive, default=MAX_ROWS, metavar="N",
        help=f"refuse (exit 1, naming the size) a table of more than N rows (default "
        f"{MAX_ROWS:,}; each row is one context resolved)",
    )
    parser.add_argument("--format", choices=("text", "csv", "json"), default="text")
    parser.add_argument("--json", action="store_true", help="the same as --format json")
    add_env_args(parser)
    add_engine_args(parser)
    add_policy_args(parser)
    parser.set_defaults(run=run)


def _target(text: str) -> Target:
    """argparse type for ``P[:ARCH][@ENGINE=VERSION]...``; a malformed engine part is a usage
    error naming it (exit 2)."""
    from interlock.core.errors import InputError
    from interlock.policy.fleet import Target

    where, *releases = text.split("@")
    platform, _, arch = where.partition(":")
    if not platform:
        raise argparse.ArgumentTypeError(
            f"expected PLATFORM[:ARCH][@ENGINE=VERSION], e.g. rocm:gfx942@vllm=0.31.0, got "
            f"{text!r}"
        )
    engine: dict[str, str] = {}
    for part in releases:
        name, sep, version = part.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(
                f"{text}: expected @ENGINE=VERSION, e.g. @vllm=0.31.0, got {'@' + part!r}"
            )
        if name in engine:
            raise argparse.ArgumentTypeError(f"{text}: engine {name!r} is given twice")
        try:
            engine[name] = engine_version(name, version, text)
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return Target(platform, arch, tuple(engine.items()))


def run(args: argparse.Namespace) -> int:
    from interlock.commands.common import check_target, features_of
    from interlock.commands.release_check import warn_outside
    from interlock.core.errors import LocatedError, PolicyError
    from interlock.policy.context import make_context
    from interlock.policy.domain import Domain
    from interlock.policy.explain import TableError, render_table
    from interlock.vllm.stage import decide_with_release

    fmt = "json" if args.json else args.format
    policy = load(args)
    env, sources = env_of(args, policy, process=False)
    engine, engine_sources = engine_of(args)
    sources.update(engine_sources)
    features = features_of(args, policy)
    architectures = _rows(policy, args.architecture)
    if args.target:
        return _fleet(args, policy, architectures, fmt, features=features, env=env,
                      engine=engine, sources=sources)
    platforms = args.platform or _platforms(policy)
    for platform in args.platform or ():
        check_target(platform, args.device_arch)
    domain = Domain.of(policy)
    size = len(architectures) * len(platforms) * len(domain.config_states)
    if size > args.max_contexts:
        raise PolicyError(
            f"policy table: {len(architectures)} architectures x {len(platforms)} platforms x "
            f"{len(domain.config_states)} config states make {size} rows, over the bound of "
            f"{args.max_contexts} that keeps it to seconds; pick rows with --architecture or "
            f"--platform, or give --max-contexts {size} to resolve them anyway"
        )
    rows: list[Any] = []
    for arch in architectures:
        for platform in platforms:
            for config in domain.config_states:
                state = None if config is None else dict(config)
                try:
                    context = make_context(
                        arch, platform=platform, device_arch=args.device_arch,
                        features=features, env=env, engine=engine, sources=sources,
                        config=state,
                    )  # fmt: skip
                    # A refusal is the cell's outcome, shown with its rule; not an error.
                    rows.append(decide_with_release(policy, context, refused=True))
                except LocatedError as exc:  # one context's error is its cell, not the table's end
                    rows.append(TableError(arch, platform, str(exc), state))
    sys.stdout.write(render_table(rows, fmt, policy.vocabulary.names))
    warn_outside("policy table", policy, engine.get("vllm"), sources.get("engine.vllm", ""))
    if fmt == "text":
        for line in domain.describe_enumeration()[len(domain.bounded):][:1] if (
            domain.config_predicates
        ) else []:
            sys.stdout.write(f"\nrows per {line}\n")
        for note in domain.bounded:
            sys.stdout.write(f"bounded: {note}\n")
    return 1 if any(isinstance(r, TableError) for r in rows) else 0


def _rows(policy: Policy, patterns: list[str] | None) -> list[str]:
    """The catalog architectures ``patterns`` select (all without any); a literal name outside
    the catalog is a row too (it shows the decision for an unknown model)."""
    from fnmatch import fnmatchcase

    from interlock.core.errors import InputError
    from interlock.core.suggest import hint

    if not patterns:
        return list(policy.catalog)
    rows: dict[str, None] = {}
    for pattern in patterns:
        if any(c in pattern for c in "*?["):
            matched = [a for a in policy.catalog if fnmatchcase(a, pattern)]
            if not matched:
                raise InputError(f"--architecture {pattern}: matches no catalog architecture")
            rows.update(dict.fromkeys(matched))
        else:
            if pattern not in policy.catalog and hint(pattern, policy.catalog):
                raise InputError(
                    f"--architecture {pattern}: not in the catalog{hint(pattern, policy.catalog)}"
                )
            rows[pattern] = None
    return list(rows)


def _fleet(
    args: argparse.Namespace, policy: Policy, architectures: list[str], fmt: str,
    **context: Any,
) -> int:
    from interlock.commands.common import check_target
    from interlock.commands.release_check import refuse_outside, warn_outside
    from interlock.core.errors import InputError
    from interlock.policy.fleet import fleet, render_fleet
    from interlock.vllm.stage import decide_with_release

    if args.platform or args.device_arch:
        raise InputError("--target names each column's platform and arch; drop --platform and "
                         "--device-arch")
    for target in args.target:
        check_target(target.platform, target.device_arch, "--target")
        # A column of a release the policy is not written for would show another release's
        # decisions under that release's name: refused before anything is decided.
        engine, sources = target.engine_facts(context["engine"], context["sources"])
        if target.engine:
            refuse_outside(f"policy table: --target {target.name}", policy,
                           engine.get("vllm"), sources.get("engine.vllm", ""))

    def decide_cell(p: Policy, ctx: Any) -> Any:
        # A column's release decides through its engine stage: the cell is what it runs. A
        # refusal is the cell's outcome, shown with its rule; not an error.
        return decide_with_release(p, ctx, refused=True)

    table = fleet(policy, architectures, args.target, decide_cell, base=_base(args), **context)
    sys.stdout.write(render_fleet(table, fmt))
    # --engine-version's vLLM against the policy's release (a column's was checked above).
    warn_outside("policy table", policy, context["engine"].get("vllm"),
                 context["sources"].get("engine.vllm", ""))
    return 1 if table.failed else 0


def _base(args: argparse.Namespace) -> Policy | None:
    """The policy changed cells are compared with: --against, else the layers of a layered
    policy below its last file (None for a single file)."""
    from interlock.core.errors import PolicyError
    from interlock.policy.loader import load_policy, load_policy_sources, policy_paths, read_source

    if args.against is not None:
        return load_policy([args.against])
    files = policy_paths(args.policy)
    if len(files) < 2:
        return None
    try:
        return load_policy_sources([(name, read_source(path, name)) for name, path in files[:-1]])
    except PolicyError:
        return None  # the layers below do not stand alone: nothing to compare with


def _platforms(policy: Policy) -> list[str]:
    named: dict[str, None] = dict.fromkeys(PLATFORM_NAMES)
    for rule in policy.rules:
        match = rule.when.name_match("platform")
        if match is not None:
            named.update(dict.fromkeys(sorted(match.literals)))
    return list(named)
