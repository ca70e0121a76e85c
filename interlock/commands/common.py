"""Flags shared by subcommands, and turning them into a policy, a context and overrides."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from interlock.core.decision import VOCABULARIES
from interlock.core.env import POLICY
from interlock.core.fields import parse_scalar
from interlock.policy.model import Policy

if TYPE_CHECKING:
    from interlock.app.query import Query
    from interlock.policy.resolution import Resolution

GIVEN_ENV = "given with --env"
GIVEN_ENGINE = "given with --engine-version"


def pair(text: str) -> tuple[str, str]:
    """argparse type for ``K=V`` flags."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def seconds(text: str) -> float:
    """argparse type for a duration: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def percent(text: str) -> float:
    """argparse type for a share in percent: a finite number >= 0 (NaN would make every
    comparison with it false, silently)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite percentage >= 0")
    return value


def positive(text: str) -> int:
    """argparse type for a count of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return int(text)


def natural(text: str) -> int:
    """argparse type for a count of at least 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 0")
    return int(text)


def port(text: str) -> int:
    """argparse type for a TCP port (1 to 65535)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)")
    return value


def add_policy_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy",
        action="append",
        metavar="FILE",
        help="policy file, or a stack a.yaml:b.yaml as INTERLOCK_POLICY writes it (@shipped is "
        "the shipped policy); repeat to layer (default: $INTERLOCK_POLICY, else the shipped one)",
    )


def add_pairs(parser: argparse.ArgumentParser, flag: str, metavar: str, help: str) -> None:
    """A repeatable ``flag KEY=VALUE``, gathered as a list of ``(key, value)`` pairs."""
    parser.add_argument(flag, action="append", type=pair, default=[], metavar=metavar, help=help)


def add_env_args(parser: argparse.ArgumentParser) -> None:
    add_pairs(parser, "--env", "K=V",
              "value of an environment variable the policy binds (wins over the real one)")


def add_context_args(parser: argparse.ArgumentParser) -> None:
    """ARCH and the flags describing the context, plus --policy, --env and --set."""
    parser.add_argument(
        "architecture", nargs="?", metavar="ARCH", help="HF architecture, e.g. LlamaForCausalLM"
    )
    add_context_flags(parser)
    parser.add_argument(
        "--model", metavar="PATH|NAME",
        help="model directory, config.json, GGUF file, or a named model (smollm2, demo): "
        "architecture and traits",
    )
    add_model_id_arg(parser)
    add_policy_args(parser)


def add_model_id_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-id",
        metavar="NAME",
        help="the model's identity for `model:` conditions, e.g. zai-org/GLM-5.3 (besides "
        "--model's directory name and _name_or_path)",
    )


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    add_pairs(parser, "--engine-version", "ENGINE=VERSION",
              "the engine version the decision is for, e.g. vllm=0.29.0 (`engine:` conditions)")


def add_context_flags(parser: argparse.ArgumentParser) -> None:
    """--platform, --device-arch, --feature, --env and --set: the context besides the model."""
    parser.add_argument("--platform", help="cuda, rocm, xpu, cpu… (default: detected)")
    parser.add_argument(
        "--device-arch",
        "--gfx",
        dest="device_arch",
        metavar="ARCH",
        help="device architecture, e.g. gfx950 or sm_90 (--gfx is an alias)",
    )
    add_pairs(parser, "--feature", "K=V",
              "deployment feature, e.g. tensor_parallel_size=8 (ints, floats, true/false, strings)")
    add_env_args(parser)
    add_engine_args(parser)
    add_pairs(parser, "--set", "FIELD=VALUE", "override a decision field, e.g. runner=mrv1")


def write_json(document: Any) -> None:
    """A command's ``--json`` output: the document, indented, on stdout."""
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def load(args: argparse.Namespace, engine: str | None = None) -> Policy:
    """The policy the command names; ``engine`` (a snapshot's, ``--engine``'s): with no
    --policy nor $INTERLOCK_POLICY, that engine's shipped policy, and any other policy must
    decide for it."""
    import os

    from interlock.core.errors import InputError
    from interlock.policy.loader import ENGINE_POLICIES, load_policy

    engine = engine or getattr(args, "decision_engine", None)
    paths = args.policy
    if engine is not None and not paths and not os.environ.get(POLICY.name):
        paths = [ENGINE_POLICIES[engine]]
    policy = load_policy(paths)
    if engine is not None and policy.engine != engine:
        files = ", ".join(f.path for f in policy.files)
        raise InputError(
            f"the policy ({files}) decides for {policy.vocabulary.title}, not {engine}: give "
            f"--policy {ENGINE_POLICIES[engine]} (or a policy whose version is {engine}-X.Y.Z)"
        )
    return policy


def env_of(
    args: argparse.Namespace, policy: Policy, *, process: bool = True
) -> tuple[dict[str, str], dict[str, str]]:
    """Values of the policy's env bindings: the process environment (if ``process``), then
    ``--env``; returns ``(env, sources)``. An ``--env`` name the policy does not bind is an
    error."""
    from interlock.app.query import process_env
    from interlock.core.errors import PolicyError
    from interlock.core.suggest import hint

    env, sources = process_env(policy) if process else ({}, {})
    for name, value in args.env:
        if name not in policy.env:
            declared = ", ".join(policy.env) or "none"
            raise PolicyError(
                f"--env {name}: the policy binds no such variable; declared: {declared}"
                + hint(name, policy.env)
            )
        env[name] = value
        sources[f"env.{name}"] = GIVEN_ENV
    return env, sources


def engine_of(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    """``--engine-version`` values as ``(engine, sources)``; an unknown engine or a version
    that is not PEP 440 is an error naming it."""
    engine: dict[str, str] = {}
    sources: dict[str, str] = {}
    for name, text in args.engine_version:
        engine[name] = engine_version(name, text, f"--engine-version {name}={text}")
        sources[f"engine.{name}"] = GIVEN_ENGINE
    return engine, sources


def engine_version(name: str, text: str, given: str) -> str:
    """``text`` as engine ``name``'s version; an unknown engine or a version that is not
    PEP 440 is an :class:`InputError` naming ``given`` (what the command line said)."""
    from interlock.core.errors import InputError
    from interlock.policy.conditions import ENGINES, check_version

    if name not in ENGINES:
        raise InputError(f"{given}: unknown engine {name!r}; known: " + ", ".join(ENGINES))
    try:
        return check_version(text.strip())
    except ValueError as exc:
        raise InputError(f"{given}: {exc}") from None


def check_target(platform: str | None, device_arch: str | None, flag: str = "--platform") -> None:
    """A platform named on the command line is a known one (built in, or one a registered
    plugin serves), and its device arch is named as that platform names them: a typo is an
    error with "did you mean", not a context no rule matches."""
    from interlock.core.errors import InputError
    from interlock.core.platform import device_arch_problem, platform_problem

    if platform is None:
        return
    from interlock.plugins import load_registry

    problem = platform_problem(platform, load_registry().platforms())
    if problem is not None:
        raise InputError(f"{flag} {platform}: {problem}")
    if device_arch:
        problem = device_arch_problem(device_arch, [platform])
        if problem is not None:
            raise InputError(f"--device-arch {device_arch}: {problem}")


def query_of(args: argparse.Namespace, policy: Policy, **given: Any) -> Query:
    """The query the command line asks: ARCH or --model, --platform, --device-arch,
    --feature, --env (over the process environment), --engine-version, --model-id and
    --set, each checked and typed here, once. ``given``: :class:`~interlock.app.query.Query`
    fields the command sets itself (``runs_here``, ``tensor_parallel_size``; ``model=None``
    where MODEL is another engine's argument)."""
    from interlock.app.query import Query, model_target

    # The flags this module parses first, then what the application layer reads (the
    # process environment's bindings, the model): one trip there, not two.
    check_target(args.platform, args.device_arch)
    engine, engine_sources = engine_of(args)
    features, overrides = features_of(args, policy), overrides_of(args, policy)
    env, sources = env_of(args, policy)
    sources.update(engine_sources)
    model_id = getattr(args, "model_id", None)
    if model_id is not None:
        sources["model_id"] = "given with --model-id"
    fields: dict[str, Any] = dict(
        architecture=getattr(args, "architecture", None),
        platform=args.platform, device_arch=args.device_arch,
        features=features, env=env, engine=engine, model_id=model_id,
        overrides=overrides, sources=sources,
    )
    if "model" not in given and getattr(args, "model", None) is not None:
        fields["model"] = model_target(args.model)
    if not given.get("runs_here"):
        # A question about a vLLM release read by interlock: the answer is what it runs.
        from interlock.vllm.stage import stage_for

        fields["stage"] = stage_for(engine)
    return Query(**{**fields, **given})


def feature_types(policy: Policy) -> dict[str, str]:
    """The form each known feature takes (``"an integer"``, ``"a number"``, ``"true or
    false"``): the facts runners may require, and every feature the policy's rules or the
    runners' unsupported conditions compare by order, typed by the thresholds."""
    from interlock.plugins import load_registry
    from interlock.plugins.spec import REQUIRABLE_FACTS
    from interlock.policy.conditions import FeatureMatch

    types = dict.fromkeys(REQUIRABLE_FACTS, "true or false")
    conditions = [c for rule in policy.rules for c in rule.when.conditions]
    for reg in load_registry().runners():
        conditions += [c for u in reg.spec.unsupported for c in u.condition.conditions]
    for c in conditions:
        if not isinstance(c, FeatureMatch) or c.key in types:
            continue
        # Only an order comparison (gt, ge, lt, le) says a feature is a number; equality says
        # nothing (`speculative: {ne: false}` takes a method name or false).
        values = [w for op, w in c.ops if op in ("gt", "ge", "lt", "le")]
        if values and all(type(v) is int for v in values):
            types[c.key] = "an integer"
        elif values:
            types[c.key] = "a number"
    return types


_TYPE_OK = {
    "true or false": lambda v: type(v) is bool,
    "an integer": lambda v: type(v) is int,
    "a number": lambda v: isinstance(v, (int, float)) and type(v) is not bool,
}


def features_of(args: argparse.Namespace, policy: Policy) -> dict[str, Any]:
    """``--feature`` values, typed; a known feature given a value of another form (``nan``,
    ``0x10``, ``maybe``) is an error saying the allowed form."""
    from interlock.core.errors import InputError

    features: dict[str, Any] = {}
    types = feature_types(policy) if args.feature else {}
    for key, text in args.feature:
        try:
            value = parse_scalar(text)
        except ValueError as exc:
            raise InputError(f"--feature {key}={text}: {exc}") from None
        kind = types.get(key)
        if kind is not None and not _TYPE_OK[kind](value):
            raise InputError(f"--feature {key}={text}: {key} takes {kind}, e.g. "
                             f"{key}={'true' if kind == 'true or false' else '2'}")
        features[key] = value
    return features


def overrides_of(args: argparse.Namespace, policy: Policy | None = None) -> dict[str, Any]:
    """``--set`` values, typed in ``policy``'s decision vocabulary (vLLM's without one)."""
    from interlock.core.decision import VLLM
    from interlock.core.errors import PolicyError

    vocabulary = VLLM if policy is None else policy.vocabulary
    overrides = {}
    for name, text in args.set:
        try:
            overrides[name] = vocabulary.parse(name, text)
        except ValueError as exc:
            raise PolicyError(f"--set {exc}") from None
    return overrides


def resolve_args(args: argparse.Namespace) -> Resolution:
    """Load, ask and decide: the shared body of explain and resolve. A refused resolution
    is returned (its ``refusal`` set), for the command to show."""
    from interlock.app.query import decide_query

    policy = load(args)
    query = query_of(args, policy)
    # A refused context is shown and recorded like any other; the command exits `refused`.
    resolution = decide_query(policy, query, refused=True)
    if getattr(args, "decision_log", None) is not None or args.settings.decision_log:
        record_decision(args, resolution, f"policy {args.command}", model=args.model,
                        overrides=dict(query.overrides))
    return resolution


def refused_exit(resolution: Resolution) -> int:
    """A shown resolution's exit status: ``refused`` (5) where a rule refused it, else 0;
    the refusal goes to stderr as well, for scripts that only read it."""
    from interlock.core.errors import EXIT_CODES

    if resolution.refusal is None:
        return 0
    print(f"policy: {resolution.refusal.describe()}", file=sys.stderr)
    return EXIT_CODES["refused"]


def add_decision_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str,
    description: str,
) -> argparse.ArgumentParser:
    """A command that decides for one context: ARCH and its flags (:func:`add_context_args`)
    and --decision-log (``policy explain``, ``policy resolve``)."""
    parser = subparsers.add_parser(name, help=help, description=description)
    add_context_args(parser)
    parser.add_argument(
        # Its own dest: `policy measure --engine` and `policy diff --engine` name the engine
        # a measurement runs on (interlock's `policy serve` or vLLM), not a vocabulary.
        "--engine", choices=tuple(VOCABULARIES), dest="decision_engine",
        help="the engine the decision is for: without --policy, its shipped policy "
        "(@shipped, @sglang); a given policy must decide for it",
    )
    add_decision_log_args(parser)
    return parser


def add_decision_log_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, prompts: bool = False
) -> None:
    """--decision-log FILE (and, for commands that take prompts, --decision-log-prompts)."""
    parser.add_argument(
        "--decision-log", dest="decision_log", metavar="FILE",
        help="append a decision record (one JSON line) to FILE (default: "
        "$INTERLOCK_DECISION_LOG; see docs/decision-records.md)",
    )
    if prompts:
        parser.add_argument(
            "--decision-log-prompts", dest="decision_log_prompts", action="store_true",
            help="also record the prompts (left out of decision records by default)",
        )


def record_decision(
    args: argparse.Namespace, resolution: Resolution, command: str, **details: Any
) -> None:
    """Append the decision record of ``resolution`` when a log is named (--decision-log or
    $INTERLOCK_DECISION_LOG)."""
    from interlock import decision_log
    from interlock.plugins import load_registry

    # The plugins discovered under the command's environment; an engine without
    # interlock's runners (SGLang) is handed no runner.
    if "runner" not in details and resolution.policy.vocabulary.runners:
        details["runner"] = decision_log.plugin_of(
            resolution.decision.runner, load_registry(args.settings.environ))
    decision_log.write(decision_log.log_path(args.decision_log, args.settings), resolution,
                       command, **details)
