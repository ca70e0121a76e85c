"""Engine snapshots, and how far a policy conforms to one.

A snapshot (``conformance/vllm-<version>.jsonl``, written by ``tools/vllm_probe``)
is JSON lines: a header ``{"snapshot": {...}}`` naming the engine version and the
domain, then one object per context with its ``outcome``: ``decided``, with what the
engine decided there (``runner``, ``breakable``, ``cudagraph``, ``compile``,
``capture_sizes``) and the model's ``task`` as the engine took it, or ``refused``, with
the engine's message (``refusal``); a ``probe_error`` row is one where the probe could not
run vLLM (counted, never compared). Every row's context carries
the snapshot's vLLM version as its engine fact, so one policy with ``engine:``
conditions can be checked against every release. Conformance resolves the policy on every
context and compares the outcome (a rule's refusal against the engine's), the task and
the decision field by field: ``capture_sizes`` only where the policy sets
them (elsewhere it leaves them to the runner). A disagreement covered by one of
the policy's ``deviations:`` is counted apart, never hidden; a deviation that
covers no disagreement is stale and fails conformance like a disagreement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interlock.core.decision import OUTCOME, REQUIRED_FIELDS, VLLM, VOCABULARIES, Vocabulary
from interlock.core.errors import PolicyError
from interlock.core.fields import TASKS
from interlock.core.files import FileProblem, decode_utf8, load_json, read_regular
from interlock.core.terminal import one_line
from interlock.policy.conditions import Facts, check_version
from interlock.policy.context import Context
from interlock.policy.model import Deviation, Policy
from interlock.policy.resolution import (
    EngineStage,
    PolicyRefused,
    Resolution,
    facts_of,
    resolve,
)

SNAPSHOT_SOURCE = "snapshot"
#: The engine a snapshot records; each row's context carries its version (``engine`` conditions).
ENGINE = "vllm"
#: Fields every row's decision carries; ``capture_sizes`` is compared only when the policy sets it.
COMPARED = (*REQUIRED_FIELDS, "capture_sizes")
#: A row's outcomes: the engine decided the context, or refused it.
DECIDED = "decided"
REFUSED = "refused"
#: The model's task as the engine took it, compared with the policy's ``task`` trait.
TASK = "task"


@dataclass(frozen=True)
class SnapshotRow:
    context: Context
    #: The engine's decision (field -> value), empty when it refused the context.
    decision: dict[str, Any]
    #: The engine's message where it refused the context (outcome ``refused``), else None.
    refusal: str | None
    surrogate: bool
    line: int
    #: The probe could not run vLLM's config path here (not a decision): never compared.
    probe_error: str | None = None
    #: The model's task as the engine took it (decided rows).
    task: str | None = None


@dataclass(frozen=True)
class Snapshot:
    path: str
    engine_version: str
    header: dict[str, Any]
    rows: tuple[SnapshotRow, ...]
    #: The engine it records (the header's key: ``vllm``, ``sglang``).
    engine: str = ENGINE

    @property
    def vocabulary(self) -> Vocabulary:
        return VOCABULARIES[self.engine]


@dataclass(frozen=True)
class Disagreement:
    row: SnapshotRow
    field: str
    ours: Any
    theirs: Any
    #: What decided our side: ``rule-id (stage) file:line``, or the error we raised.
    decider: str
    deviation: Deviation | None = None

    def to_dict(self) -> dict[str, Any]:
        ctx = self.row.context
        return {
            "architecture": ctx.architecture,
            "platform": ctx.platform,
            "device_arch": ctx.device_arch,
            "env": dict(ctx.env),
            "field": self.field,
            "policy": self.ours,
            "engine": self.theirs,
            "decided_by": self.decider,
            "surrogate": self.row.surrogate,
            "snapshot_line": self.row.line,
            "deviation": self.deviation.id if self.deviation else None,
        }


@dataclass
class Conformance:
    snapshot: Snapshot
    policy: Policy
    agree: int = 0
    disagreements: list[Disagreement] = field(default_factory=list)
    #: Contexts where the policy leaves capture sizes to the runner (not compared).
    sizes_not_compared: int = 0
    #: Contexts the probe could not run (``probe_error`` rows): not compared.
    not_probed: int = 0

    @property
    def undeclared(self) -> list[Disagreement]:
        return [d for d in self.disagreements if d.deviation is None]

    @property
    def declared(self) -> list[Disagreement]:
        return [d for d in self.disagreements if d.deviation is not None]

    @property
    def deviated_contexts(self) -> int:
        return len({d.row.line for d in self.declared})

    @property
    def stale_deviations(self) -> list[Deviation]:
        """Deviations that apply to some context of the snapshot but cover no disagreement
        there (one that applies to none, e.g. scoped to another engine version, is not
        stale here)."""
        used = {d.deviation.id for d in self.declared if d.deviation}
        rows = [(_facts(self.policy, r.context), r.context.env) for r in self.snapshot.rows]
        return [
            d
            for d in self.policy.deviations
            if d.id not in used and any(d.applies(facts, env) for facts, env in rows)
        ]

    @property
    def ok(self) -> bool:
        return not self.undeclared and not self.stale_deviations

    @property
    def compared(self) -> int:
        """Contexts compared outside declared deviations."""
        return len(self.snapshot.rows) - self.not_probed - self.deviated_contexts

    @property
    def agreement(self) -> float:
        """Share of the contexts outside declared deviations where every field agrees."""
        failing = len({d.row.line for d in self.undeclared})
        return 1.0 if not self.compared else (self.compared - failing) / self.compared

    def to_dict(self) -> dict[str, Any]:
        return {
            "snapshot": self.snapshot.path,
            "engine_version": self.snapshot.engine_version,
            "policy": self.policy.stamp(),
            "contexts": len(self.snapshot.rows),
            "surrogate_contexts": sum(r.surrogate for r in self.snapshot.rows),
            "agreement": self.agreement,
            "ok": self.ok,
            "agree": self.agree,
            "deviated_contexts": self.deviated_contexts,
            "not_probed": self.not_probed,
            "capture_sizes_not_compared": self.sizes_not_compared,
            "disagreements": [d.to_dict() for d in self.undeclared],
            "declared": [d.to_dict() for d in self.declared],
            "stale_deviations": [d.to_dict() for d in self.stale_deviations],
        }


#: A snapshot is ~1 MB per vLLM version; the bound keeps a hostile one (a link to /dev/zero)
#: from filling memory.
MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
#: Row fields that must be non-empty strings (an empty one would fail resolution far away
#: from its line).
_NAMED = ("architecture", "platform")
_DECISION_TYPES: dict[str, tuple[type, ...]] = {
    "runner": (str,), "cudagraph": (str,), "breakable": (bool,), "compile": (bool,),
}


def _brief(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else f"{text[:60]}…"


def load_snapshot(path: str | Path) -> Snapshot:
    """Read a snapshot; a malformed one is a :class:`PolicyError` naming file:line.

    Read like a policy file: a regular file only (a FIFO is refused, not waited on), at most
    :data:`MAX_SNAPSHOT_BYTES`, UTF-8, each line strict JSON with bounded nesting."""
    name = str(path)
    try:
        data = read_regular(Path(path), MAX_SNAPSHOT_BYTES, name)
        decode_utf8(data, name)
    except FileProblem as exc:
        raise PolicyError(
            f"cannot read snapshot: {exc.detail}", file=exc.file or name, line=exc.line,
            col=exc.col,
        ) from None
    lines = data.split(b"\n")
    if not data.strip():
        raise PolicyError("empty snapshot", file=name)
    header = _object(lines[0], name, 1)
    meta = header.get("snapshot")
    # The engine is the key its version is under: vLLM's, else another's (SGLang's).
    engine = ENGINE if not isinstance(meta, dict) else next(
        (e for e in VOCABULARIES if isinstance(meta.get(e), str)), ENGINE
    )
    if not isinstance(meta, dict) or not isinstance(meta.get(engine), str):
        raise PolicyError('line 1 must be {"snapshot": {"vllm": VERSION, ...}}', file=name, line=1)
    try:
        check_version(meta[engine])
    except ValueError as exc:
        raise PolicyError(f"snapshot.{engine}: {exc}", file=name, line=1) from None
    rows = []
    for number, text in enumerate(lines[1:], start=2):
        if text.strip():
            rows.append(_row(_object(text, name, number), name, number, meta[engine], engine))
    return Snapshot(name, meta[engine], meta, tuple(rows), engine)


def _object(text: bytes, name: str, line: int) -> dict[str, Any]:
    try:
        data = load_json(text, name)
    except FileProblem as exc:
        col = exc.col if exc.line in (None, 1) else None
        raise PolicyError(exc.detail, file=name, line=line, col=col) from None
    if not isinstance(data, dict):
        raise PolicyError("each line is a JSON object", file=name, line=line)
    return data


def _row(
    data: dict[str, Any], name: str, line: int, version: str, engine: str = ENGINE
) -> SnapshotRow:
    vocabulary = VOCABULARIES[engine]
    # A snapshot of an engine without interlock's runners (SGLang) records no task and no
    # environment.
    env = data.get("env", None if vocabulary.runners else {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise PolicyError("env must map names to strings", file=name, line=line, path="env")
    for key in ("architecture", "platform", "device_arch"):
        if not isinstance(data.get(key), str):
            raise PolicyError(f"{key} must be a string", file=name, line=line, path=key)
        if key in _NAMED and not data[key].strip():
            raise PolicyError(f"{key} must not be empty", file=name, line=line, path=key)
    probe_error = data.get("probe_error")
    for key in ("refusal", "probe_error"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise PolicyError(f"{key} must be a string or null", file=name, line=line, path=key)
    outcome = data.get("outcome")
    if probe_error is None and outcome not in (DECIDED, REFUSED):
        raise PolicyError(
            f'outcome must be "{DECIDED}" or "{REFUSED}", not {_brief(outcome)}', file=name,
            line=line, path="outcome",
        )
    refusal = data.get("refusal") if outcome == REFUSED else None
    if outcome == REFUSED and not refusal:
        raise PolicyError(
            "a refused row needs the engine's message (refusal)", file=name, line=line,
            path="refusal",
        )
    task = data.get(TASK)
    if outcome == DECIDED and vocabulary.runners and task not in TASKS:
        raise PolicyError(
            f"task must be one of {', '.join(TASKS)}, not {_brief(task)}", file=name,
            line=line, path=TASK,
        )
    decision = {}
    if outcome == DECIDED and probe_error is None:
        missing = [f for f in vocabulary.required if f not in data]
        if missing:
            raise PolicyError(
                f"a decided row needs {', '.join(missing)}", file=name, line=line
            )
        if vocabulary is not VLLM:
            return _engine_row(data, name, line, version, engine)
        decision = {f: data.get(f) for f in COMPARED}
        for key, types in _DECISION_TYPES.items():
            if key in decision and not isinstance(decision[key], types):
                raise PolicyError(
                    f"{key} must be a {' or '.join(t.__name__ for t in types)}, not "
                    f"{_brief(decision[key])}", file=name, line=line, path=key,
                )
        sizes = decision["capture_sizes"]
        if sizes is not None:
            if not isinstance(sizes, list) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes
            ):
                raise PolicyError(
                    "capture_sizes must be null or a list of positive integers, not "
                    f"{_brief(sizes)}", file=name, line=line, path="capture_sizes",
                )
            decision["capture_sizes"] = tuple(sizes)
    features = data.get("features", {})
    # Facts the probe fixed for the row (the CPU rows: whether vLLM had Triton).
    if not isinstance(features, dict) or not all(
        isinstance(v, bool) for v in features.values()
    ):
        raise PolicyError("features must map names to true or false", file=name, line=line,
                          path="features")
    try:
        context = Context(
            data["architecture"],
            platform=data["platform"],
            device_arch=data["device_arch"],
            env=env,
            features=features,
            sources={
                **{f"env.{k}": SNAPSHOT_SOURCE for k in env},
                **{f"features.{k}": SNAPSHOT_SOURCE for k in features},
                f"engine.{engine}": f"{SNAPSHOT_SOURCE} ({name})",
            },
            engine={engine: version},
        )
    except PolicyError as exc:
        raise PolicyError(exc.message, file=name, line=line) from None
    return SnapshotRow(
        context, decision, refusal, bool(data.get("surrogate")), line, probe_error,
        task if outcome == DECIDED else None,
    )


def _engine_row(
    data: dict[str, Any], name: str, line: int, version: str, engine: str
) -> SnapshotRow:
    """A decided row of an engine other than vLLM: every field of its vocabulary checked as
    a policy's value is (an optional one may be null: the engine did not say)."""
    vocabulary = VOCABULARIES[engine]
    decision: dict[str, Any] = {}
    for key in vocabulary.names:
        value = data.get(key)
        if value is None and key in vocabulary.optional:
            decision[key] = None
            continue
        try:
            decision[key] = vocabulary.check(key, value)
        except ValueError as exc:
            raise PolicyError(str(exc), file=name, line=line, path=key) from None
    try:
        context = Context(
            data["architecture"], platform=data["platform"], device_arch=data["device_arch"],
            sources={f"engine.{engine}": f"{SNAPSHOT_SOURCE} ({name})"},
            engine={engine: version},
        )
    except PolicyError as exc:
        raise PolicyError(exc.message, file=name, line=line) from None
    return SnapshotRow(context, decision, None, False, line)


def conformance(
    policy: Policy, snapshot: Snapshot, engine: EngineStage | None = None
) -> Conformance:
    """Compare ``policy`` with ``snapshot`` on every context of the snapshot; ``engine``: the
    engine stage of the snapshot's release (what it makes of the decision handed to it), so
    that what is compared is what interlock hands that release. A policy for another engine
    than the snapshot's is an error: their fields are not the same."""
    if policy.engine != snapshot.engine:
        raise PolicyError(
            f"{snapshot.path} records {snapshot.vocabulary.title}, but the policy "
            f"({', '.join(f.path for f in policy.files)}) decides for "
            f"{policy.vocabulary.title}: give a policy whose version is "
            f"{snapshot.engine}-X.Y.Z"
        )
    report = Conformance(snapshot, policy)
    for row in snapshot.rows:
        if row.probe_error is not None:
            report.not_probed += 1
            continue
        found = _compare(policy, row, engine)
        optional = set(policy.vocabulary.optional)
        if not optional & {d.field for d in found} and row.refusal is None:
            report.sizes_not_compared += _sizes_left_to_runner(policy, row, engine)
        if found:
            report.disagreements.extend(found)
        else:
            report.agree += 1
    return report


def _sizes_left_to_runner(policy: Policy, row: SnapshotRow, engine: EngineStage | None) -> int:
    """1 where the policy leaves an optional field (vLLM's capture sizes, SGLang's max_bs) to
    the runner or engine in ``row``'s context: not compared there."""
    try:
        provenance = resolve(policy, row.context, engine=engine).provenance
    except PolicyError:
        return 0
    return int(any(name not in provenance for name in policy.vocabulary.optional))


def _compare(policy: Policy, row: SnapshotRow, engine: EngineStage | None) -> list[Disagreement]:
    theirs_outcome = REFUSED if row.refusal is not None else DECIDED
    try:
        res = resolve(policy, row.context, engine=engine)
    except PolicyRefused as exc:
        if row.refusal is not None:
            return []
        refusal = exc.refusal
        return [
            _disagree(
                policy, row, OUTCOME, f"refused: {refusal.message}", DECIDED,
                f"{refusal.by} (refusal) {refusal.location}",
            )
        ]
    except PolicyError as exc:
        # An error is not a refusal: no rule of the policy says the engine refuses here.
        return [
            _disagree(policy, row, OUTCOME, f"error: {exc.message}", theirs_outcome, str(exc))
        ]
    if row.refusal is not None:
        return [
            _disagree(policy, row, OUTCOME, DECIDED, f"refused: {row.refusal}", "resolution")
        ]
    ours = res.decision.to_dict()
    found = _compare_task(policy, row, res)
    vocabulary = policy.vocabulary
    for name in COMPARED if vocabulary is VLLM else vocabulary.names:
        prov = res.provenance.get(name)
        if prov is None:  # capture sizes left to the runner, max_bs to SGLang
            continue
        theirs = row.decision[name]
        mine = tuple(ours[name]) if name == "capture_sizes" else ours[name]
        if mine != theirs:
            where = f" {prov.location}" if prov.location else ""
            decider = f"{prov.source} ({prov.stage}){where}"
            found.append(_disagree(policy, row, name, mine, theirs, decider))
    return found


def _compare_task(policy: Policy, row: SnapshotRow, res: Resolution) -> list[Disagreement]:
    fact = res.traits[TASK]
    # A surrogate row's task is that of Llama's class run under the name, not the model's.
    if row.task is None or row.surrogate or fact.value == row.task:
        return []
    where = f" {fact.note}" if fact.note else ""
    return [_disagree(policy, row, TASK, fact.value, row.task, f"{fact.origin}{where}")]


def _disagree(
    policy: Policy, row: SnapshotRow, name: str, ours: Any, theirs: Any, decider: str
) -> Disagreement:
    facts = _facts(policy, row.context)
    deviation = next(
        (d for d in policy.deviations if d.field == name and d.applies(facts, row.context.env)),
        None,
    )
    return Disagreement(row, name, ours, theirs, decider, deviation)


def _facts(policy: Policy, context: Context) -> Facts:
    entry = policy.catalog.get(context.architecture)
    return facts_of(context, dict(entry.traits) if entry else {})


def render_text(report: Conformance) -> str:
    snap = report.snapshot
    stamp = report.policy.stamp()
    title = snap.vocabulary.title
    lines = [
        f"{snap.path}: {title} {snap.engine_version}, {len(snap.rows)} contexts "
        f"({sum(r.surrogate for r in snap.rows)} with a surrogate model config)",
        f"policy {stamp['version']} from {', '.join(stamp['files'])}",
        "",
        f"agreement  {100 * report.agreement:.1f} % of {report.compared} contexts outside "
        "declared deviations",
        f"  agree            {report.agree}",
        f"  disagree         {len({d.row.line for d in report.undeclared})} contexts, "
        f"{len(report.undeclared)} fields",
        f"  deviations       {report.deviated_contexts} contexts, declared "
        f"({len({d.deviation.id for d in report.declared if d.deviation})} deviations)",
    ]
    if report.not_probed:
        lines.append(
            f"  not probed       {report.not_probed} contexts ({title}'s config path could not "
            "run on the probe's stand-in config: not compared)"
        )
    if report.sizes_not_compared:
        which, whom = ("capture_sizes", "the runner") if snap.vocabulary.runners else (
            "max_bs", title)
        lines.append(
            f"  {which:<16} not compared in {report.sizes_not_compared} contexts "
            f"(the policy leaves them to {whom})"
        )
    if report.undeclared:
        lines += ["", f"disagreements (policy vs {title}; decided by)"]
        lines += [_line(d, title) for d in report.undeclared]
    if report.declared:
        lines += ["", "declared deviations (every context: --json)"]
        groups: dict[tuple[str, str, str, str], list[Disagreement]] = {}
        for d in report.declared:
            key = (d.deviation.id if d.deviation else "", d.field, _show(d.ours), _show(d.theirs))
            groups.setdefault(key, []).append(d)
        for (dev_id, name, ours, theirs), members in groups.items():
            where = members[0].deviation.location if members[0].deviation else ""
            archs = sorted({m.row.context.architecture for m in members})
            lines.append(
                f"  {dev_id} ({where}): {len(members)} contexts of {', '.join(archs)}: "
                f"{name} policy {ours} vs {title} {theirs}"
            )
    for dev in report.stale_deviations:
        lines += ["", f"stale deviation {dev.id} ({dev.location}): no disagreement left to cover"]
    # Each entry is one line: a line break in a snapshot's field is shown, not obeyed.
    return "\n".join(map(one_line, lines)) + "\n"


def _line(d: Disagreement, title: str) -> str:
    ctx = d.row.context
    env = " ".join(f"{k}={v}" for k, v in sorted(ctx.env.items())) or "env unset"
    mark = " (surrogate)" if d.row.surrogate else ""
    return (
        f"  {ctx.architecture} on {ctx.platform}/{ctx.device_arch}, {env}{mark}: "
        f"{d.field} policy {_show(d.ours)} vs {title} {_show(d.theirs)}; {d.decider}"
    )


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)
