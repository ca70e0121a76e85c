"""``policy impact --log FILE OLD NEW``: which recorded deployments a policy edit would change.

Every context in the decision log is resolved again under OLD and under NEW (each a
policy file or a stack of them, ``@shipped:site.yaml`` as ``$INTERLOCK_POLICY`` writes
it) with the overrides it was recorded with; a deployment (host, model, context and
overrides) whose decisions differ is listed once, with each changed field, old -> new and
the rule that decides each side. ``policy diff`` answers the same over the catalog's
domain; this answers it over what actually ran. Exit 1 with ``--fail-on-change`` when a
deployment would change (and on a policy or log error).

``--vllm X.Y.Z`` asks the upgrade question: each deployment vLLM ran is replayed under OLD
on the release it recorded and under NEW on vLLM X.Y.Z, each through its release's engine
stage (:mod:`interlock.vllm.stage`), so a decision the new release refuses (an MRV1 site
rule on 0.34.0, which removed Model Runner V1) is listed as becoming refused.

A record that lacks a fact some rule of OLD or NEW reads (config values, the model's
identity or the engine version: records written before they were kept), where that rule's
other conditions hold, is listed as "cannot tell", never as unchanged; ``--fail-on-change``
fails on it too. Lines that are not records a replay can use are named and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from interlock.commands.common import write_json
from interlock.core.errors import LocatedError, PolicyError

if TYPE_CHECKING:
    from interlock.policy.model import Policy
    from interlock.policy.trace import Provenance
from interlock.core.terminal import one_line


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "impact",
        help="which recorded deployments a policy edit would change",
        description="Replay every context of a decision log under OLD and NEW and list the "
        "recorded deployments whose decision would change: host, model, platform/arch, "
        "field, old -> new, and the rules deciding each side.",
    )
    parser.add_argument("--log", required=True, metavar="FILE", help="a decision log")
    parser.add_argument("old", metavar="OLD", help=f"policy file or stack (a{os.pathsep}b)")
    parser.add_argument("new", metavar="NEW", help=f"policy file or stack (a{os.pathsep}b)")
    parser.add_argument(
        "--fail-on-change", action="store_true",
        help="exit 1 when a recorded deployment would change (for CI)",
    )
    parser.add_argument(
        "--vllm", metavar="X.Y.Z",
        help="the upgrade question: replay the deployments vLLM ran under NEW on this vLLM "
        "release (one interlock has read), through what that release runs and refuses",
    )
    parser.add_argument("--json", action="store_true", help="print the changes as JSON")
    parser.set_defaults(run=run)


def load_stack(text: str) -> Policy:
    """A policy given as one file or a stack (``policy.loader.parse_stack``: ``os.pathsep``
    between files, ``@shipped`` for the shipped one), layered in order."""
    from interlock.policy.loader import load_policy

    return load_policy([text])


def run(args: argparse.Namespace) -> int:
    from interlock.decision_log import records

    old, new = load_stack(args.old), load_stack(args.new)
    if args.vllm is not None:
        from interlock.vllm.releases import release

        release(args.vllm)  # a release interlock has not read is refused before anything
    found, problems = records(args.log)
    for problem in problems:
        print(f"policy impact: {args.log}:{problem.line}: {problem.detail} (skipped)",
              file=sys.stderr)
    deployments: dict[str, dict[str, Any]] = {}
    for number, record in found:
        key = json.dumps([record.get("host"), record.get("model"), record["context"],
                          record.get("overrides") or {}], sort_keys=True)
        entry = deployments.setdefault(key, {"record": record, "lines": []})
        entry["record"], entry["lines"] = record, [*entry["lines"], number]
    changed, unknown = [], []
    for entry in deployments.values():
        record, lines = entry["record"], entry["lines"]
        blind = undecidable(old, record) + undecidable(new, record)
        if blind:
            unknown.append({**_where(record), "records": len(lines), "lines": lines,
                            "cannot_tell": sorted(set(blind))})
            continue
        change = compare(old, new, record, args.log, lines[-1], args.vllm)
        if change is not None:
            changed.append({**change, "records": len(lines), "lines": lines})
    notes = unknown_runners(found)
    for note in notes:
        print(f"policy impact: {args.log}:{note['line']}: {one_line(note['detail'])}",
              file=sys.stderr)
    if args.json:
        write_json({
            "log": args.log, "old": args.old, "new": args.new,
            "deployments": len(deployments), "changed": changed, "cannot_tell": unknown,
            "notes": notes,
            "skipped": [{"line": p.line, "detail": p.detail} for p in problems],
        })
    else:
        for change in changed:
            sys.stdout.write(render(change))
        for entry in unknown:
            sys.stdout.write(render_unknown(entry))
        tail = f", {len(unknown)} cannot tell" if unknown else ""
        skipped = f", {len(problems)} line(s) skipped" if problems else ""
        sys.stdout.write(
            f"{len(changed)} of {len(deployments)} recorded deployment(s) would change{tail} "
            f"({len(found)} record(s) in {one_line(args.log)}{skipped})\n"
        )
    return 1 if args.fail_on_change and (changed or unknown) else 0


def undecidable(policy: Any, record: dict[str, Any]) -> list[str]:
    """The rules of ``policy`` that may match ``record`` but read a fact it does not carry
    (``id (file:line): reads config``): their outcome on replay is unknown."""
    from interlock.decision_log import recorded_context, unrecorded
    from interlock.policy.conditions import ConfigMatch, EngineMatch, ModelMatch
    from interlock.policy.resolution import context_facts

    missing = set(unrecorded(record))
    if not missing:
        return []
    kinds = {ConfigMatch: "config", ModelMatch: "model", EngineMatch: "engine"}
    facts = context_facts(policy, recorded_context(record))
    out = []
    for rule in policy.rules:
        reads = {kinds[type(c)] for c in rule.when.conditions if type(c) in kinds} & missing
        others = [c for c in rule.when.conditions if kinds.get(type(c)) not in missing]
        if reads and all(c.holds(facts) for c in others):
            out.append(f"{rule.id} ({rule.location}) reads {', '.join(sorted(reads))}, "
                       "which the record does not carry")
    return out


def unknown_runners(found: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A note for each record whose runner (decided or forced) no installed plugin provides:
    its replay runs under this machine's plugins, not the recorded ones."""
    from interlock.plugins import load_registry

    known = set(load_registry().runner_names())
    notes = []
    for line, record in found:
        names = {record["decision"].get("runner"), (record.get("overrides") or {}).get("runner")}
        for name in sorted(n for n in names if isinstance(n, str) and n not in known):
            notes.append({"line": line, "detail": f"runner {name!r} is not provided by any "
                          "installed plugin; replayed with the plugins installed here"})
    return notes


def _where(record: dict[str, Any]) -> dict[str, Any]:
    ctx = record["context"]
    return {
        "host": record.get("host"),
        "model": record.get("model"),
        "architecture": ctx.get("architecture"),
        "platform": ctx.get("platform"),
        "device_arch": ctx.get("device_arch"),
        "command": record.get("command"),
        "last_seen": record.get("time"),
    }


def compare(
    old: Any, new: Any, record: dict[str, Any], log: str, line: int, vllm: str | None = None
) -> dict[str, Any] | None:
    """What would change for the deployment of ``record`` (on vLLM ``vllm`` under ``new``,
    where vLLM ran it): None when nothing would."""
    ran = ran_on_vllm(record)
    before = _decide(old, record, log, line, ran)
    after = _decide(new, record, log, line, vllm or ran if ran is not None else None)
    fields = []
    for name in dict.fromkeys([*before["decision"], *after["decision"]]):
        was, now = before["decision"].get(name), after["decision"].get(name)
        if was != now:
            fields.append({
                "field": name, "old": was, "new": now,
                "old_rule": before["by"].get(name), "new_rule": after["by"].get(name),
            })
    if not fields:
        return None
    return {**_where(record), "fields": fields}


def ran_on_vllm(record: dict[str, Any]) -> str | None:
    """The vLLM release a record says it was handed to (its runner is vLLM's own and its
    context names the version), when interlock has read that release."""
    from interlock.vllm.releases import known

    runner = record.get("runner")
    engine = record["context"].get("engine")
    if not isinstance(runner, dict) or runner.get("distribution") != "vllm":
        return None
    version = engine.get("vllm") if isinstance(engine, dict) else None
    if not isinstance(version, str):
        return None
    try:
        read = known(version)
    except PolicyError:
        return None
    return read.version if read is not None else None


def _decide(
    policy: Any, record: dict[str, Any], log: str, line: int, vllm: str | None = None
) -> dict[str, Any]:
    """The replayed decision and who decides each field (on vLLM ``vllm`` through its
    release's stage, where given); a context the policy or the release refuses has the
    refusal as its ``outcome``."""
    from interlock.core.errors import InputError
    from interlock.decision_log import replay
    from interlock.vllm.stage import ReleaseStage

    stage = versions = None
    if vllm is not None:
        stage, versions = ReleaseStage(vllm), {"vllm": vllm}
    try:
        resolution = replay(policy, record, stage, versions)
    except LocatedError as exc:  # a policy's or a plugin's (stage 5) error
        return {"decision": {"outcome": f"refused: {exc}"}, "by": {}}
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{log}:{line}: the recorded context cannot be replayed: {exc}") from None
    decision = resolution.decision.to_dict()
    return {
        "decision": {"outcome": "decided", **decision},
        "by": {name: _who(prov) for name, prov in resolution.provenance.items()},
    }


def _who(prov: Provenance) -> str:
    who = "defaults" if prov.stage == "defaults" else f"{prov.stage} {prov.source}"
    return f"{who} ({prov.location})" if prov.location else who


def _head(change: dict[str, Any]) -> str:
    where = change["platform"] + (f"/{change['device_arch']}" if change["device_arch"] else "")
    return one_line(f"{change['host']}  {change['model'] or '-'}  {change['architecture']} on "
                    f"{where}  ({change['records']} record(s), last {change['last_seen']})")


def render(change: dict[str, Any]) -> str:
    lines = [_head(change)]
    for f in change["fields"]:
        lines.append(one_line(f"    {f['field']}: {_show(f['old'])} -> {_show(f['new'])}  "
                              f"[{f['old_rule'] or '-'} -> {f['new_rule'] or '-'}]"))
    return "\n".join(lines) + "\n"


def render_unknown(blind: dict[str, Any]) -> str:
    lines = [_head(blind) + "  CANNOT TELL"]
    lines += [one_line(f"    {why}") for why in blind["cannot_tell"]]
    return "\n".join(lines) + "\n"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "unset" if value is None else str(value)
