"""Decision records: one JSON line per resolution, appended to a log that many processes share.

A record says what was decided and why, for whom, and (for a run) what came of it: a
decision id and a UTC time, the host and the command, the policy's files (with their
SHA-256), version and revision, the whole context with the source of each fact, the
decision with each field's provenance (stage, rule id, file:line, ref), the model's task,
the rule that refused the context (if one did), the deviations that apply, the runner and
the plugin distribution that provides it, and an outcome for runs.
``policy vllm serve`` adds what the engine's startup log confirmed (``engine``).
The JSON Schema is ``schemas/decision-record.schema.json``.

Writers never coordinate: each record is one ``os.write`` of one line to a file opened with
``O_APPEND``, so concurrent appends land whole and in some order (a line is bounded by
:data:`MAX_LINE_BYTES`, far below what a local file system splits). A new log is created
0600: records name hosts, paths and models. Prompt text is recorded only when asked for.

The commands and :class:`interlock.llm.LLM` only call :func:`build_record` and
:func:`append_record`; ``policy log`` and ``policy impact`` read with :func:`read_records`
and replay with :func:`replay`.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from interlock.core.env import Settings
from interlock.core.errors import InputError
from interlock.core.terminal import one_line
from interlock.policy.context import Context, make_context
from interlock.policy.trace import OVERRIDES

if TYPE_CHECKING:
    from interlock.plugins.registry import PluginRegistry
    from interlock.policy.model import Policy
    from interlock.policy.resolution import EngineStage, Resolution

#: The environment variable naming the log when ``--decision-log`` / ``decision_log=`` is not
#: given.
#: The record format; a reader refuses other values.
RECORD_VERSION = 1
#: The longest record line written or read (bytes, newline included).
MAX_LINE_BYTES = 64 * 1024
#: Each recorded prompt keeps at most this many characters (or token ids).
MAX_PROMPT_CHARS = 2000


class DecisionLogError(InputError):
    """The decision log cannot be written or read (exit 1)."""


def log_path(given: str | os.PathLike[str] | None, settings: Settings) -> str | None:
    """The log to append to: ``given``, else ``$INTERLOCK_DECISION_LOG`` (in ``settings``,
    read where the command, the ``LLM`` or the plugin started), else none."""
    if given is not None:
        path = os.fspath(given)
        if not path:
            raise DecisionLogError("--decision-log '': an empty path names no file")
        return path
    return settings.decision_log


def build_record(
    resolution: Resolution,
    command: str,
    *,
    model: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    capabilities: bool = True,
    runner: Mapping[str, Any] | None = None,
    outcome: Mapping[str, Any] | None = None,
    engine: Mapping[str, Any] | None = None,
    prompts: Sequence[str | Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The record of one resolution. ``command`` names who resolved (``policy run``,
    ``LLM``…); ``overrides`` and ``capabilities`` (whether stage 5 ran) are what a replay needs
    besides the context; ``runner`` defaults to the plugin registered for the decided runner;
    ``prompts`` is recorded only when given (each cut to :data:`MAX_PROMPT_CHARS`)."""
    import socket
    import uuid

    resolved = resolution.to_dict()
    context = resolution.context
    policy = resolution.policy
    if overrides is None:
        overrides = {
            name: prov.value for name, prov in resolution.provenance.items()
            if prov.stage == OVERRIDES
        }
    record: dict[str, Any] = {
        "record": RECORD_VERSION,
        "id": uuid.uuid4().hex,
        "time": datetime.now(timezone.utc).isoformat(timespec="microseconds").replace(
            "+00:00", "Z"
        ),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "command": command,
        "model": model,
        "policy": {
            "version": policy.version,
            "schema_version": policy.schema_version,
            "revision": policy.revision,
            "files": [{"path": f.path, "sha256": f.sha256} for f in policy.files],
            # The decision's vocabulary where it is not vLLM's (a record without it is).
            **({} if policy.engine == "vllm" else {"engine": policy.engine}),
        },
        "context": {
            **context.to_dict(),
            "traits": dict(context.traits),
            "model_traits": dict(context.model_traits),
            "resolved_traits": resolved["context"]["traits"],
            "in_catalog": resolution.in_catalog,
            # What ``config:`` conditions read, so a replay can read it too.
            **({} if context.config is None else {"config_values": _config_values(context)}),
        },
        "overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()},
        "capabilities": capabilities,
        "decision": resolved["decision"],
        "provenance": resolved["provenance"],
        "deviations": resolved["deviations"],
        "task": resolved["task"],
        "refusal": resolved["refusal"],
        "runner": dict(runner) if runner is not None else (
            # An engine without interlock's runners (SGLang) is handed no runner.
            plugin_of(resolution.decision.runner) if policy.vocabulary.runners else None
        ),
        "outcome": dict(outcome) if outcome is not None else None,
        "engine": dict(engine) if engine is not None else None,
    }
    if prompts is not None:
        record["prompts"] = [_cut(p) for p in prompts]
    return record


def _config_values(context: Context) -> dict[str, Any]:
    """The flattened config as JSON: a non-scalar (object, array) as ``{"json": kind}``."""
    from interlock.policy.conditions import NonScalar

    return {
        path: {"json": value.kind} if isinstance(value, NonScalar) else value
        for path, value in (context.config or {}).items()
    }


def plugin_of(runner: str, plugins: PluginRegistry | None = None) -> dict[str, Any]:
    """The runner and the plugin (distribution, version) that provides it, as loaded here
    (``plugins``: the run's registry, discovered where it started; default: this process's);
    ``plugin`` is None when no loaded plugin provides it (``problem`` says why)."""
    from interlock.plugins import load_registry
    from interlock.plugins.settings import PluginError

    try:
        plugin = (plugins or load_registry()).runner(runner).plugin
    except PluginError as exc:
        return {"name": runner, "plugin": None, "distribution": None, "version": None,
                "problem": str(exc)[:500]}
    return {"name": runner, "plugin": plugin.name, "distribution": plugin.distribution,
            "version": plugin.version}


def _cut(prompt: str | Sequence[int]) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"text": prompt[:MAX_PROMPT_CHARS], "truncated": len(prompt) > MAX_PROMPT_CHARS}
    ids = list(prompt)
    return {"token_ids": ids[:MAX_PROMPT_CHARS], "truncated": len(ids) > MAX_PROMPT_CHARS}


def encode(record: Mapping[str, Any]) -> bytes:
    """The record as one line; a record that would exceed :data:`MAX_LINE_BYTES` loses its
    prompts first (``prompts_dropped``), then its config values (``config_values_dropped``:
    a replay then cannot tell what ``config:`` rules decide), and is refused if it is still
    too long."""
    line = _line(record)
    if len(line) > MAX_LINE_BYTES and "prompts" in record:
        record = {k: v for k, v in record.items() if k != "prompts"}
        record = {**record, "prompts_dropped": True}
        line = _line(record)
    context = record.get("context")
    if len(line) > MAX_LINE_BYTES and isinstance(context, dict) and "config_values" in context:
        context = {k: v for k, v in context.items() if k != "config_values"}
        line = _line({**record, "context": {**context, "config_values_dropped": True}})
    if len(line) > MAX_LINE_BYTES:
        raise DecisionLogError(
            f"a decision record of {len(line)} bytes is over the {MAX_LINE_BYTES}-byte line "
            "limit (is a context value or a model path unusually long?)"
        )
    return line


def _line(record: Mapping[str, Any]) -> bytes:
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.encode() + b"\n"


def append_record(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append ``record`` as one line with one ``write`` (``O_APPEND``), creating the file 0600.
    A path that is not a regular file (a directory, a FIFO) is refused, not waited on, and a
    symbolic link is not followed: a link planted where the log belongs (to another user's
    file, or to ``~/.bashrc``) would have records appended to what it points at."""
    line = encode(record)
    name = os.fspath(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(
        os, "O_CLOEXEC", 0
    )
    try:
        fd = os.open(name, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: a link planted where the log belongs
            raise DecisionLogError(
                f"decision log {one_line(name)}: a symbolic link; name the file it points to"
            ) from None
        raise DecisionLogError(
            f"decision log {one_line(name)}: cannot open: {exc.strerror}"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DecisionLogError(f"decision log {name}: not a regular file")
        try:
            written = os.write(fd, line)
        except OSError as exc:
            raise DecisionLogError(f"decision log {name}: cannot write: {exc.strerror}") from None
        if written != len(line):  # a full disk; the partial line is what a reader will report
            raise DecisionLogError(
                f"decision log {name}: wrote {written} of {len(line)} bytes (disk full?)"
            )
    finally:
        os.close(fd)


def write(
    path: str | None, resolution: Resolution, command: str, **details: Any
) -> dict[str, Any] | None:
    """Build and append a record when there is a log (``path`` from :func:`log_path`);
    returns the record."""
    if path is None:
        return None
    record = build_record(resolution, command, **details)
    append_record(path, record)
    return record


@dataclass(frozen=True)
class Problem:
    """A line of a log that is not a record (reported and skipped)."""

    line: int
    detail: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.detail}"


def read_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any] | Problem]]:
    """``(line number, record or Problem)`` for each line of the log, streamed."""
    from interlock.core.files import FileProblem, open_regular

    name = os.fspath(path)
    try:
        # One open, checked after: a FIFO renamed over the log is refused, not waited on.
        handle = open_regular(name)
    except FileProblem as exc:
        raise DecisionLogError(f"decision log {name}: {exc.detail}") from None
    except OSError as exc:
        raise DecisionLogError(f"decision log {name}: {exc.strerror}") from None
    with handle:
        for number, raw in enumerate(_lines(handle), 1):
            yield number, _parse(raw)


def _lines(handle: Any) -> Iterator[bytes]:
    while True:
        raw = handle.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            rest = raw
            while rest and not rest.endswith(b"\n"):  # skip the rest of the long line
                rest = handle.readline(MAX_LINE_BYTES)
            yield b""  # reported as over the limit below
            continue
        yield raw


def _parse(raw: bytes) -> dict[str, Any] | Problem:
    if not raw:
        return Problem(0, f"longer than the {MAX_LINE_BYTES}-byte line limit")
    if not raw.endswith(b"\n"):
        return Problem(0, "an unfinished line (a writer stopped mid-record?)")
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return Problem(0, f"not JSON: {exc}")
    if not isinstance(record, dict) or record.get("record") != RECORD_VERSION:
        return Problem(0, f"not a decision record of format {RECORD_VERSION}")
    for key in ("time", "host", "command", "context", "decision", "provenance"):
        if key not in record:
            return Problem(0, f"no {key!r}")
    wrong = _shape_problem(record)
    return record if wrong is None else Problem(0, wrong)


#: The type each top-level field of a record must have (None: the field may be null).
_SHAPE: dict[str, tuple[type, ...]] = {
    "time": (str,), "host": (str,), "command": (str,), "context": (dict,),
    "decision": (dict,), "provenance": (dict,), "deviations": (list,), "policy": (dict,),
    "model": (str, type(None)), "pid": (int,), "overrides": (dict, type(None)),
    "capabilities": (bool,), "runner": (dict, type(None)), "outcome": (dict, type(None)),
    "engine": (dict, type(None)), "prompts": (list,),
}


def _shape_problem(record: Mapping[str, Any]) -> str | None:
    """Why a parsed record cannot be shown or replayed (a field of the wrong type, a context
    that is not one, an override that is not a value of its field), or None."""
    from interlock.core.decision import VOCABULARIES
    from interlock.core.errors import PolicyError

    for key, types in _SHAPE.items():
        if key in record and not isinstance(record[key], types):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            return f"{key} is not {names}"
    engine = record.get("engine") or {}
    if not isinstance(engine.get("verified", False), bool) or not all(
        isinstance(p, str) for p in _as_list(engine.get("problems", []))
    ) or not isinstance(engine.get("vllm_version", ""), (str, type(None))):
        return "engine: verified is not a bool, problems not strings or vllm_version not text"
    engine_name = record.get("policy", {}).get("engine", "vllm")
    if engine_name not in VOCABULARIES:
        return f"policy.engine is not one of {', '.join(VOCABULARIES)}"
    vocabulary = VOCABULARIES[engine_name]
    check_field = vocabulary.check
    try:
        for name, value in record["decision"].items():
            if name in vocabulary.optional:  # null where the policy left it unset
                if value is not None:
                    check_field(name, tuple(value) if isinstance(value, list) else value)
            else:
                check_field(name, value)
    except (PolicyError, ValueError, TypeError) as exc:
        return f"decision: {_brief(exc)}"
    try:
        recorded_context(record)
        for name, value in (record.get("overrides") or {}).items():
            check_field(name, tuple(value) if isinstance(value, list) else value)
    except (PolicyError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return f"not a context or overrides interlock can replay: {_brief(exc)}"
    return None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [None]


def _brief(exc: BaseException) -> str:
    text = str(exc) if not isinstance(exc, KeyError) else f"no {exc.args[0]!r}"
    return text[:300]


def records(
    path: str | os.PathLike[str],
) -> tuple[list[tuple[int, dict[str, Any]]], list[Problem]]:
    """Every record of the log with its line number, and the lines that are not records."""
    found, problems = [], []
    for number, item in read_records(path):
        if isinstance(item, Problem):
            problems.append(Problem(number, item.detail))
        else:
            found.append((number, item))
    return found, problems


def recorded_context(record: Mapping[str, Any]) -> Context:
    """The context a record was resolved for, rebuilt exactly: its facts, the model's
    identity, the engine versions and the config values (raises ``PolicyError``, ``ValueError``
    or ``TypeError`` on a damaged record)."""
    from interlock.policy.conditions import NonScalar

    ctx = record["context"]
    if not isinstance(ctx, dict):
        raise ValueError("context is not an object")
    identity = ctx.get("model", [])
    if not isinstance(identity, list):
        raise ValueError("context.model is not a list")
    config = ctx.get("config_values")
    if config is not None and not isinstance(config, dict):
        raise ValueError("context.config_values is not an object")
    # Built as every reader builds its context: a record from before a fact was recorded
    # (has_triton) gets it as a query would.
    return make_context(
        _text(ctx["architecture"], "architecture"),
        platform=_text(ctx["platform"], "platform"),
        device_arch=_text(ctx.get("device_arch", ""), "device_arch"),
        features=dict(ctx.get("features", {})),
        env=dict(ctx.get("env", {})),
        traits=dict(ctx.get("traits", {})),
        model_traits=dict(ctx.get("model_traits", {})),
        sources={k: _text(v, f"sources.{k}") for k, v in dict(ctx.get("sources", {})).items()},
        config=None if config is None else {
            path: NonScalar(value["json"]) if isinstance(value, dict) else value
            for path, value in config.items()
        },
        identity=tuple(
            (_text(entry["name"], "model.name"), _text(entry["source"], "model.source"))
            for entry in identity
        ),
        engine={k: _text(v, f"engine.{k}") for k, v in dict(ctx.get("engine", {})).items()},
    )


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"context.{name} is not text")
    return value


#: The facts a rule can read that a record may not carry (it predates them, or they were
#: dropped to fit the line): ``config`` values, the ``model`` identity, ``engine`` versions.
UNRECORDED_FACTS = ("config", "model", "engine")


def unrecorded(record: Mapping[str, Any]) -> tuple[str, ...]:
    """The kinds of facts (:data:`UNRECORDED_FACTS`) rules may read that ``record`` lacks:
    a replay can only say "cannot tell" for rules that read them."""
    ctx = record["context"]
    missing = []
    if ctx.get("config", True) is not False and "config_values" not in ctx:
        missing.append("config")  # a model config was read (or unsaid), its values not kept
    if "model" not in ctx:
        missing.append("model")
    if "engine" not in ctx:
        missing.append("engine")
    return tuple(missing)


def replay(
    policy: Policy, record: Mapping[str, Any], engine: EngineStage | None = None,
    versions: Mapping[str, str] | None = None,
) -> Resolution:
    """The recorded context resolved again under ``policy``, with the recorded overrides and
    (when the record's resolution had it) stage 5's capabilities; ``engine``: the engine
    stage of the release the decision is handed to, ``versions``: engine versions replacing
    the recorded ones (an upgrade's question)."""
    from dataclasses import replace

    from interlock.app.query import decide_context

    overrides = record.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ValueError("overrides is not an object")
    context = recorded_context(record)
    if versions:
        context = replace(context, engine={**context.engine, **versions})
    # A record made without stage 5 (the vLLM plugin's) was decided for vLLM's runners.
    return decide_context(policy, context, overrides, stage=engine,
                          executed_by="interlock" if record.get("capabilities", True) else "vllm")


def parse_time(text: str) -> datetime:
    """A record's ``time`` (ISO 8601, ``Z`` for UTC) as an aware datetime."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
