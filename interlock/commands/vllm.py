"""``policy vllm args|serve MODEL [vllm serve args...]``: run vLLM with the policy's decision.

``args`` prints the command (``--json``: the decision, its adjustments, env and
argv); ``serve`` logs the one-line provenance and replaces itself with
``vllm serve``. Options of this command come before MODEL; everything after
MODEL is ``vllm serve``'s. Exit 1 on a policy or input error (and when ``vllm``
is not on PATH), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys

from interlock.commands.common import add_policy_args, load, write_json

#: This command's options; after MODEL they would silently go to vllm serve.
OWN_OPTIONS = ("--platform", "--device-arch", "--policy", "--json")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "vllm",
        help="print or exec `vllm serve` with the policy's decision made explicit",
        description="Read the architecture from MODEL's config.json, resolve the policy on "
        "the detected (or given) platform, and print or exec `vllm serve MODEL` with "
        "VLLM_USE_V2_MODEL_RUNNER, VLLM_USE_BREAKABLE_CUDAGRAPH, -cc.cudagraph_mode and "
        "-cc.mode all set. Your own env vars and vllm serve flags win: they enter the "
        "resolution as env bindings and overrides. vLLM's later adjustments (no piecewise "
        "graphs without compilation, pooling models piecewise) are applied and reported; "
        "one that would undo a flag you gave is refused.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (("args", "print the command"), ("serve", "exec vllm serve")):
        sub = actions.add_parser(name, help=text, description=text)
        sub.add_argument("model", metavar="MODEL", help="local model directory (config.json)")
        sub.add_argument(
            "vllm_args", nargs=argparse.REMAINDER, metavar="...", help="vllm serve arguments"
        )
        sub.add_argument("--platform", help="cuda, rocm… (default: detected)")
        sub.add_argument("--device-arch", dest="device_arch", metavar="ARCH", help="e.g. gfx950")
        add_policy_args(sub)
        if name == "args":
            sub.add_argument("--json", action="store_true", help="print the command as JSON")
        sub.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.core.errors import PolicyError
    from interlock.model_run import decided_by, process_env
    from interlock.policy.context import make_context
    from interlock.policy.resolution import resolve
    from interlock.vllm_serve import read_user_flags, serve_command

    own = [a for a in args.vllm_args if a.split("=")[0] in OWN_OPTIONS]
    if own:
        raise PolicyError(
            f"{own[0]} comes after MODEL, where arguments go to vllm serve; "
            f"put policy vllm's own options before MODEL"
        )
    policy = load(args)
    user = read_user_flags(args.vllm_args)
    env, sources = process_env(policy)
    context = make_context(
        None,
        model=args.model,
        platform=args.platform,
        device_arch=args.device_arch,
        env=env,
        sources=sources,
    )
    resolution = resolve(policy, context, user.overrides)
    command = serve_command(resolution, args.model, args.vllm_args, user)
    where = f"{context.platform} {context.device_arch}".strip()
    print(
        f"policy vllm: {context.architecture} on {where}: {decided_by(resolution)}",
        file=sys.stderr,
    )
    for adj in command.adjustments:
        print(
            f"policy vllm: vLLM adjusts {adj.field} {adj.before} -> {adj.after}: {adj.why}",
            file=sys.stderr,
        )
    if args.action == "args":
        if args.json:
            write_json(command.to_dict())
        else:
            env_text = " ".join(f"{k}={v}" for k, v in command.env.items())
            print(f"{env_text} {shlex.join(command.argv)}")
        return 0
    if shutil.which("vllm") is None:
        raise PolicyError(
            "vllm is not on PATH: install vLLM or activate its environment "
            "(`policy vllm args MODEL` prints the command instead)"
        )
    sys.stdout.flush()
    os.execvpe("vllm", command.argv, {**os.environ, **command.env})
