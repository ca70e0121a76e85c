"""``policy conformance SNAPSHOT``: how far a policy reproduces an engine's recorded decisions."""

from __future__ import annotations

import argparse
import sys

from interlock.commands.common import add_policy_args, load, write_json


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "conformance",
        help="compare a policy with an engine snapshot (conformance/vllm-*.jsonl, "
        "conformance/sglang-*.jsonl)",
        description="Resolve the policy on every context of an engine snapshot (written by "
        "tools/vllm_probe from vLLM's own config code) and print every field where they "
        "disagree, with the rule that decided it on the policy's side, through the engine "
        "stage of the snapshot's release (interlock/vllm/releases.py). Disagreements the "
        "policy declares under `deviations:` are counted apart; a deviation that covers no "
        "disagreement is stale. Exit 0 on full agreement outside declared deviations, 1 "
        "otherwise (and on a malformed snapshot). Without --policy or $INTERLOCK_POLICY, the "
        "shipped policy of the snapshot's engine (@sglang for an SGLang snapshot).",
    )
    parser.add_argument("snapshot", metavar="SNAPSHOT", help="a snapshot file (JSON lines)")
    add_policy_args(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.policy.snapshot import conformance, load_snapshot, render_text
    from interlock.vllm.releases import known
    from interlock.vllm.stage import ReleaseStage

    snapshot = load_snapshot(args.snapshot)
    # What is compared is what interlock hands that release: its engine stage included
    # (vLLM's: interlock hands SGLang its decision inside SGLang's own resolution).
    vllm = snapshot.engine == "vllm" and snapshot.engine_version
    read = known(snapshot.engine_version) if vllm else None
    stage = ReleaseStage(read.version) if read is not None else None
    report = conformance(load(args, engine=snapshot.engine), snapshot, stage)
    if args.json:
        write_json(report.to_dict())
    else:
        sys.stdout.write(render_text(report))
    return 0 if report.ok else 1
