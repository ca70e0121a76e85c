"""Take a new vLLM release in: what it changed, what to add to interlock, what it refuses.

Run by ``make vllm-release VLLM=X`` after the release's snapshot is taken
(``conformance/vllm-X.jsonl``). It writes ``build/vllm-release-X/``:

- ``report.md``: what an operator reads: per context, what vLLM X decides otherwise than
  the release before it; how far the shipped policy (through X's engine stage, where
  interlock has read X) agrees with X; which rules of the given site policies (``--site``)
  become refused on X; and the facts of X's wheel that interlock's release table
  (``interlock/vllm/releases.py``) holds, checked against its entry or drafted for it;
- ``vllm-X.draft.yaml``: a history policy drafted for the contexts that changed: a layer
  over the previous release's history policy whose rules set what X decides there (a
  maintainer names and explains them before it is committed);
- ``changes.jsonl``: every changed context, old and new.

Runs in interlock's environment; it reads X's wheel as text in the probe venv (``--venv``)
and never imports vLLM.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SNAPSHOTS = REPO / "conformance"
HISTORY = REPO / "examples" / "history"
FIELDS = ("runner", "cudagraph", "breakable", "compile")


def _key(row: Any) -> tuple[Any, ...]:
    ctx = row.context
    return (ctx.architecture, ctx.platform, ctx.device_arch, tuple(sorted(ctx.env.items())),
            tuple(sorted((k, str(v)) for k, v in ctx.features.items())))


def _outcome(row: Any) -> dict[str, Any]:
    if row.probe_error is not None:
        return {"outcome": "probe_error"}
    if row.refusal is not None:
        return {"outcome": "refused", "refusal": row.refusal}
    return {"outcome": "decided", **{f: row.decision.get(f) for f in FIELDS}}


def _delta(change: dict[str, Any]) -> str:
    """``breakable false -> true`` for what differs (the outcome when it does)."""
    old, new = change["old"], change["new"]
    if old["outcome"] != new["outcome"]:
        return f"{old['outcome']} -> {new['outcome']} {new.get('refusal', '')}".strip()
    return ", ".join(f"{f} {json.dumps(old.get(f))} -> {json.dumps(new.get(f))}"
                     for f in FIELDS if old.get(f) != new.get(f))


def previous_snapshot(version: str, snapshots: Path = SNAPSHOTS) -> Path:
    from packaging.version import Version

    older = sorted((p for p in snapshots.glob("vllm-*.jsonl")
                    if Version(p.stem.removeprefix("vllm-")) < Version(version)),
                   key=lambda p: Version(p.stem.removeprefix("vllm-")))
    if not older:
        raise SystemExit(f"vllm-release: no snapshot older than {version} in {snapshots}")
    return older[-1]


def changes(old: Any, new: Any) -> list[dict[str, Any]]:
    """Every context of ``new`` whose outcome differs from ``old``'s (or that ``old`` lacks)."""
    before = {_key(r): r for r in old.rows}
    out = []
    for row in new.rows:
        was = before.get(_key(row))
        now = _outcome(row)
        then = _outcome(was) if was is not None else {"outcome": "absent"}
        if now != then:
            ctx = row.context
            out.append({"architecture": ctx.architecture, "platform": ctx.platform,
                        "device_arch": ctx.device_arch, "env": dict(ctx.env),
                        "features": dict(ctx.features), "old": then, "new": now})
    return out


def draft_policy(version: str, previous: str, changed: list[dict[str, Any]]) -> str:
    """A history layer: for each (platform, field, value) the new release decides otherwise
    with no env override, one rule listing the architectures."""
    from interlock.vllm.releases import KNOBS

    meaning = {k.name: (k.field, {text: value for value, text in k.values}) for k in KNOBS
               if k.kind == "env"}
    groups: dict[tuple[str, str, Any], set[str]] = defaultdict(set)
    refused: dict[tuple[str, str], set[str]] = defaultdict(set)
    for change in changed:
        new, old = change["new"], change["old"]
        if change["env"] and new["outcome"] == "refused":
            # What the env override decided, as the policy's env bindings read it.
            decided = {meaning[k][0]: meaning[k][1][v] for k, v in change["env"].items()
                       if k in meaning and v in meaning[k][1]}
            if decided:
                shown = ", ".join(f"{f}: {json.dumps(v)}" for f, v in sorted(decided.items()))
                refused[(shown, new["refusal"])].add(change["architecture"])
            continue
        if change["env"] or new["outcome"] != "decided" or old["outcome"] != "decided":
            continue
        for field in FIELDS:
            if new[field] == old.get(field):
                continue
            if field == "compile" and new["breakable"] and not new["compile"]:
                continue  # breakable graphs run without compilation: the policy implies it
            groups[(change["platform"], field, new[field])].add(change["architecture"])
    lines = [
        "# yaml-language-server: $schema=../../schemas/policy.schema.json",
        f"# DRAFT by `make vllm-release VLLM={version}`: vLLM {version}'s changes over "
        f"{previous}, as a layer",
        f"# over examples/history/vllm-{previous}.yaml. Name each rule, give its reason "
        "and ref,",
        "# merge it into a history policy of its own, and check it with `policy conformance`.",
        "schema_version: 1",
        f'version: "vllm-{version}"',
        "rules:",
    ]
    for (platform, field, value), archs in sorted(groups.items(), key=str):
        shown = json.dumps(value) if not isinstance(value, str) else value
        lines += [
            f"  - id: {platform}-{field}-{str(value).lower()}-from-{version}",
            "    when:",
            f"      platform: {platform}",
            f"      architecture: [{', '.join(sorted(archs))}]",
            f"    set: {{{field}: {shown}}}",
            f"    reason: vLLM {version} decides {field}={shown} here ({len(archs)} "
            "architecture(s); drafted from its snapshot)",
        ]
    for number, ((decided, message), archs) in enumerate(sorted(refused.items()), start=1):
        lines += [
            f"  - id: refused-{number}-from-{version}",
            f"    when: {{architecture: [{', '.join(sorted(archs))}]}}",
            f"    decided: {{{decided}}}",
            f"    refuse: {json.dumps(message.split(', ', 1)[-1][:200])}",
            f"    reason: vLLM {version} stops at startup here (drafted from its snapshot)",
        ]
    if lines[-1] == "rules:":
        lines[-1] = "rules: []  # no context decides otherwise"
    return "\n".join(lines) + "\n"


def wheel_facts(venv: Path) -> dict[str, Any]:
    """What X's wheel says on the points interlock's release table holds, read as text."""
    sites = sorted(venv.glob("lib/python3*/site-packages/vllm"))
    if not sites:
        raise SystemExit(f"vllm-release: no vllm package in {venv}")
    root = sites[0]

    def text(rel: str) -> str:
        path = root / rel
        return path.read_text(errors="replace") if path.is_file() else ""

    def line_of(rel: str, pattern: str) -> int | None:
        for number, line in enumerate(text(rel).splitlines(), start=1):
            if re.search(pattern, line):
                return number
        return None

    envs = text("envs.py")
    return {
        "reads VLLM_USE_V2_MODEL_RUNNER": '"VLLM_USE_V2_MODEL_RUNNER":' in envs,
        "reads VLLM_USE_BREAKABLE_CUDAGRAPH": '"VLLM_USE_BREAKABLE_CUDAGRAPH":' in envs,
        "V1 removed (validate_environ)": "Model Runner V1 has been removed" in text(
            "platforms/interface.py"),
        "breakable verdict in compilation_config": "use_breakable_cudagraph:" in text(
            "config/compilation.py"),
        "seam": line_of("config/vllm.py", r"def try_verify_and_update_config"),
        "seam call": line_of("config/vllm.py", r"self\.try_verify_and_update_config\(\)"),
        "logs 'Using V2 Model Runner'": "Using V2 Model Runner" in text(
            "v1/worker/gpu_worker.py"),
        "config log line": line_of("v1/engine/core.py", r"Initializing a V1 LLM engine"),
        "levels": line_of("config/vllm.py", r"^OPTIMIZATION_LEVEL_00 = "),
        "static graphs": line_of("config/vllm.py",
                                 r"if current_platform\.support_static_graph_mode\(\):"),
        "piecewise": line_of("config/vllm.py", r"def _normalize_piecewise_cudagraph_mode"),
    }


def table_check(version: str, facts: dict[str, Any]) -> list[str]:
    """The release table's entry for ``version`` against the wheel's facts: a line per
    disagreement, or the facts to write an entry from when there is none."""
    from interlock.vllm.releases import BREAKABLE_KNOB, CONFIG_VERDICT, RUNNER_KNOB, known

    rel = known(version)
    if rel is None:
        return [f"vLLM {version} is not in interlock/vllm/releases.py: add a Release entry "
                "from these facts (file:line in the wheel):"] + [
            f"- {name}: {value}" for name, value in facts.items()]
    problems = []
    checks = [
        ("reads VLLM_USE_V2_MODEL_RUNNER", rel.reads(RUNNER_KNOB)),
        ("reads VLLM_USE_BREAKABLE_CUDAGRAPH", rel.reads(BREAKABLE_KNOB)),
        ("breakable verdict in compilation_config", rel.breakable_verdict == CONFIG_VERDICT),
        ("logs 'Using V2 Model Runner'", rel.logs is not None and rel.logs.runner_v2 is not None),
        ("seam", rel.seam.line if rel.seam else None),
        ("seam call", rel.seam_call.line if rel.seam_call else None),
    ]
    for name, table in checks:
        if facts[name] != table:
            problems.append(f"- {name}: the wheel says {facts[name]}, the table {table}")
    return problems or [f"interlock/vllm/releases.py's entry for {version} agrees with the "
                        "wheel on every point read"]


def site_refusals(version: str, snapshot: Any, sites: list[str]) -> list[str]:
    """For each site policy (over the shipped one), the rules whose decisions vLLM
    ``version`` refuses on the snapshot's contexts without env overrides."""
    from interlock.policy.loader import load_policy
    from interlock.policy.resolution import RULES, PolicyRefused, resolve
    from interlock.vllm.releases import known
    from interlock.vllm.stage import ReleaseStage

    if known(version) is None:
        return ["(no engine stage: interlock has not read this release yet)"]
    out = []
    for site in sites:
        policy = load_policy([str(REPO / "policies.yaml"), site])
        site_rules = {r.id for r in policy.rules if str(r.location.file) == site or
                      r.location.file.endswith(Path(site).name)}
        hits: dict[str, set[str]] = defaultdict(set)
        for row in snapshot.rows:
            if row.context.env:
                continue
            try:
                resolve(policy, row.context, engine=ReleaseStage(version))
            except PolicyRefused as exc:
                for name, prov in exc.refusal.decided.items():
                    if prov.stage == RULES and prov.source in site_rules:
                        ctx = row.context
                        hits[f"{prov.source} ({prov.location}) sets {name}"].add(
                            f"{ctx.architecture} on {ctx.platform} {ctx.device_arch}: "
                            f"{exc.refusal.message}")
        if not hits:
            out.append(f"- {site}: no rule becomes refused on vLLM {version}")
        for rule, where in sorted(hits.items()):
            out.append(f"- {site}: rule {rule}: refused on {len(where)} context(s), e.g. "
                       f"{sorted(where)[0]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", required=True, metavar="X.Y.Z")
    parser.add_argument("--venv", required=True, type=Path, help="the release's probe venv")
    parser.add_argument("--site", action="append", default=[], metavar="FILE",
                        help="a site policy whose rules to check against the release")
    parser.add_argument("--out", type=Path, help="default: build/vllm-release-X")
    parser.add_argument("--snapshots", type=Path, default=SNAPSHOTS,
                        help="where the snapshots are (default: conformance/)")
    args = parser.parse_args(argv)
    from interlock.policy import load_policy
    from interlock.policy.snapshot import conformance, load_snapshot
    from interlock.vllm.releases import known
    from interlock.vllm.stage import ReleaseStage

    started = time.monotonic()
    version = args.vllm
    new_path = args.snapshots / f"vllm-{version}.jsonl"
    if not new_path.is_file():
        raise SystemExit(f"vllm-release: {new_path} is missing (make vllm-snapshot VLLM={version})")
    old_path = previous_snapshot(version, args.snapshots)
    old, new = load_snapshot(old_path), load_snapshot(new_path)
    changed = changes(old, new)
    out = args.out or REPO / "build" / f"vllm-release-{version}"
    out.mkdir(parents=True, exist_ok=True)
    with (out / "changes.jsonl").open("w") as f:
        for change in changed:
            f.write(json.dumps(change, sort_keys=True) + "\n")
    draft = draft_policy(version, old.engine_version, changed)
    (out / f"vllm-{version}.draft.yaml").write_text(draft)
    read = known(version)
    stage = ReleaseStage(read.version) if read else None
    shipped = conformance(load_policy([str(REPO / "policies.yaml")]), new, stage)
    base = HISTORY / f"vllm-{old.engine_version}.yaml"
    drafted = None
    if base.is_file():
        drafted = conformance(load_policy([str(base), str(out / f"vllm-{version}.draft.yaml")]),
                              new, stage)
    by_field: dict[str, int] = defaultdict(int)
    for change in changed:
        if change["new"]["outcome"] != change["old"]["outcome"]:
            by_field[f"outcome {change['old']['outcome']} -> {change['new']['outcome']}"] += 1
        else:
            for field in FIELDS:
                if change["new"].get(field) != change["old"].get(field):
                    by_field[field] += 1
    report = [
        f"# vLLM {version}, taken in",
        "",
        f"Snapshot `{new_path.name}` ({len(new.rows)} contexts) against "
        f"`{old_path.name}` ({old.engine_version}).",
        "",
        "## What changed",
        "",
        f"{len(changed)} context(s) decide otherwise:",
        *[f"- {name}: {count}" for name, count in sorted(by_field.items())],
        "",
        "Per architecture (first contexts; all of them in `changes.jsonl`):",
        *[f"- {c['architecture']} on {c['platform']} {c['device_arch']}"
          f"{' ' + json.dumps(c['env']) if c['env'] else ''}: {_delta(c)}"
          for c in changed[:40]],
        "",
        "## The shipped policy on this release",
        "",
        f"- policies.yaml: {100 * shipped.agreement:.1f} % of {shipped.compared} contexts agree "
        f"({'through the release stage' if stage else 'no release stage: not read yet'})",
        (f"- examples/history/vllm-{old.engine_version}.yaml + the draft: "
         f"{100 * drafted.agreement:.1f} % of {drafted.compared}" if drafted else
         f"- no examples/history/vllm-{old.engine_version}.yaml to draft over"),
        "",
        "## Site rules that become refused",
        "",
        *(site_refusals(version, new, args.site) if args.site else ["(no --site given)"]),
        "",
        "## The release table (interlock/vllm/releases.py)",
        "",
        *table_check(version, wheel_facts(args.venv)),
        "",
    ]
    (out / "report.md").write_text("\n".join(report))
    took = time.monotonic() - started
    print(f"vllm-release: {len(changed)} changed context(s); shipped policy "
          f"{100 * shipped.agreement:.1f} %; report in {out / 'report.md'} ({took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
