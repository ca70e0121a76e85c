"""Checking a running ``vllm serve`` against the decision it was started with.

vLLM says what it runs in its startup log, and only there. The lines read (messages as
vLLM's own source writes them; the same text in every release 0.27.1–0.34, at the places
each release's ``Release.logs`` lists, :mod:`interlock.vllm.releases`):

- the engine config, once: ``Initializing a V1 LLM engine (v%s) with config: %s``
  (``v1/engine/core.py``), whose ``compilation_config={...}`` holds
  ``'mode': <CompilationMode.NAME: n>`` and ``'cudagraph_mode': <CUDAGraphMode.NAME: ...>``;
- ``Using V2 Model Runner`` (``v1/worker/gpu_worker.py``), logged once when V2 runs and
  **nothing** when V1 runs: V1 is known only once the server is up without that line.
  0.34.0 has no V1 and logs no such line: there the runner is V2 by the release itself;
- ``Breakable CUDA graph enabled`` (``compilation/breakable_cudagraph.py``), logged when a
  model is wrapped for breakable capture (breakable on and a cudagraph mode other than
  NONE), and ``Auto-enabling VLLM_USE_BREAKABLE_CUDAGRAPH=1...`` (``config/vllm.py``) when
  vLLM switched breakable graphs on by itself;
- ``Starting vLLM server on %s`` (``entrypoints/launchers/api_server/entry.py``): the
  engine is built and the server is about to listen (``entrypoints/openai/api_server.py``
  before 0.29); what has not been seen by then will not be.

A line is vLLM's when it has the logger's shape (``LEVEL MM-DD HH:MM:SS [file.py:N]
message``, after any process prefix such as ``(EngineCore pid=12)``); the message is
compared whole. :class:`EngineCheck` reads lines and reaches a verdict as soon as one is
possible; :func:`interlock.vllm.supervise.supervise` runs the engine as a child and feeds it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from interlock.core.errors import PolicyError
from interlock.vllm.releases import NEWEST, RELEASES, Release, UnknownRelease, release

#: The messages, identical in every release read (each wheel's source; where each release
#: logs them is its ``Release.logs``). 0.34.0 no longer logs the runner: it has only V2.
RUNNER_V2_MESSAGE = "Using V2 Model Runner"
CONFIG_MESSAGE = re.compile(r"^Initializing a V1 LLM engine \(v(?P<version>[^)]*)\) with config: ")
BREAKABLE_MESSAGE = "Breakable CUDA graph enabled"
AUTO_BREAKABLE_MESSAGE = "Auto-enabling VLLM_USE_BREAKABLE_CUDAGRAPH=1."
READY_MESSAGE = "Starting vLLM server on "


#: vLLM's logger: ``LEVEL MM-DD HH:MM:SS [file:line] message`` after any prefix.
_LOG_LINE = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"\[(?P<where>[^\]\s]+:\d+)\] (?P<message>.*)$"
)
#: The most breakable lines kept in a verdict (each start logs one or two).
_MAX_SHOWN = 8
ANSI = re.compile(r"\x1b\[[0-9;]*m")
_COMPILATION = re.compile(r"compilation_config=\{")
_MODE = re.compile(r"'mode': <CompilationMode\.(?P<name>[A-Z_]+): \d+>")
_CUDAGRAPH = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(?P<name>[A-Z_]+): [^>]*>")


def log_release(version: str | None) -> Release:
    """The release whose startup log is read for vLLM ``version`` (None: the newest read). A
    release interlock has not read, or whose startup log it has not read, is refused: its
    lines could mean something else (0.34.0 stopped logging the runner)."""
    rel = NEWEST if version is None else release(version)
    if rel.logs is None:
        raise UnknownRelease(
            f"vLLM {rel.version}'s startup log was not read by interlock (it reads those of "
            f"{', '.join(r.version for r in RELEASES if r.logs)}): what it runs cannot be "
            "confirmed from it"
        )
    return rel


def compile_mode_name(compile_on: bool, platform: str = "") -> str:
    """The ``CompilationMode`` vLLM runs for interlock's ``compile`` field on ``platform``:
    vLLM's CPU platform turns VLLM_COMPILE into DYNAMO_TRACE_ONCE (``platforms/cpu.py``,
    ``check_and_update_config``, 0.30-0.33); NONE stays NONE."""
    if not compile_on:
        return "NONE"
    return "DYNAMO_TRACE_ONCE" if platform == "cpu" else "VLLM_COMPILE"


def expected_from(decision: Mapping[str, Any], platform: str = "") -> dict[str, Any]:
    """What the engine's log must show for ``decision`` (the target profile that ``vllm
    serve`` was started with) on ``platform``."""
    return {
        "runner": decision["runner"],
        "breakable": bool(decision["breakable"]),
        "cudagraph_mode": str(decision["cudagraph"]).upper(),
        "mode": compile_mode_name(bool(decision["compile"]), platform),
    }


@dataclass
class Verification:
    """The verdict on one engine start: ``verified`` with what was expected and seen."""

    verified: bool
    expected: dict[str, Any]
    seen: dict[str, Any]
    #: One sentence per disagreement (empty when verified).
    problems: list[str]
    #: What ended the check: ``ready``, ``mismatch``, ``timeout`` or ``exited``.
    ended_by: str
    vllm_version: str
    formats: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verified": self.verified,
            "ended_by": self.ended_by,
            "expected": self.expected,
            "seen": self.seen,
            "problems": self.problems,
            "vllm_version": self.vllm_version,
            "log_formats": self.formats,
        }

    def line(self) -> str:
        """The one line a person reads: loud when the engine did not confirm the decision."""
        if self.verified:
            shown = ", ".join(f"{k}={_show(v)}" for k, v in self.seen.items()
                              if k in self.expected)
            return f"policy vllm: verified: the engine runs the decision ({shown})"
        return ("policy vllm: WARNING: THE ENGINE DID NOT CONFIRM THE DECISION: "
                + "; ".join(self.problems))


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class EngineCheck:
    """Reads the engine's output line by line and decides whether it runs the decision.

    A contradiction (a line saying otherwise) ends the check at once; a confirmation that
    can only be an absence (V1, breakable off) waits for the ready line."""

    def __init__(self, decision: Mapping[str, Any], version: str | None = None,
                 platform: str = "") -> None:
        #: Whether the release was known before the log: else the config line's is read.
        self.given = version is not None
        self.release = log_release(version)
        self.version = version or self.release.version
        assert self.release.logs is not None  # log_release refuses a release without
        self.formats = self.release.logs
        self.expected = expected_from(decision, platform)
        self.seen: dict[str, Any] = {}
        self.problems: list[str] = []
        self.verdict: Verification | None = None

    def feed(self, text: str) -> Verification | None:
        """One line of output; returns the verdict when this line reached it."""
        if self.verdict is not None:
            return None
        match = _LOG_LINE.search(ANSI.sub("", text).rstrip("\r\n"))
        if match is None:
            return None
        message, where = match["message"].rstrip(), match["where"]
        if CONFIG_MESSAGE.match(message):
            self._config(message, where)
        elif message == RUNNER_V2_MESSAGE:
            self.seen["runner"] = "mrv2"
            self.seen["runner_line"] = where
            if self.expected["runner"] != "mrv2":
                self.problems.append(
                    f"runner: decided {self.expected['runner']}, but vLLM logged "
                    f"{RUNNER_V2_MESSAGE!r} [{where}]"
                )
        elif message == BREAKABLE_MESSAGE or message.startswith(AUTO_BREAKABLE_MESSAGE):
            self.seen["breakable"] = True
            shown = self.seen.setdefault("breakable_lines", [])
            if len(shown) < _MAX_SHOWN:  # a log repeating the line costs no more memory
                shown.append(f"{where} {message}")
            if not self.expected["breakable"]:
                self.problems.append(
                    f"breakable: decided false, but vLLM logged {message!r} [{where}]"
                )
        elif message.startswith(READY_MESSAGE):
            self.seen["ready_line"] = where
            return self._end("ready")
        if self.problems:
            return self._end("mismatch")
        return None

    def _config(self, message: str, where: str) -> None:
        version = CONFIG_MESSAGE.match(message)["version"]  # type: ignore[index]
        self.seen["vllm_version"] = version
        if not self.given:
            # No version was known before the engine said its own: read its release's lines.
            try:
                self.release = log_release(version)
            except PolicyError as exc:
                self.problems.append(f"the engine is vLLM {version} [{where}]: {exc}")
                return
            assert self.release.logs is not None
            self.formats, self.version = self.release.logs, self.release.version
        self.seen["config_line"] = where
        start = _COMPILATION.search(message)
        tail = message[start.end():] if start else ""
        for key, pattern in (("mode", _MODE), ("cudagraph_mode", _CUDAGRAPH)):
            found = pattern.search(tail)
            value = found["name"] if found else None
            self.seen[key] = value
            if value is None:
                self.problems.append(
                    f"{key}: the engine's config line [{where}] shows no compilation_config "
                    f"{key}"
                )
            elif value != self.expected[key]:
                self.problems.append(
                    f"{key}: decided {self.expected[key]}, but the engine's config "
                    f"[{where}] has {value}"
                )

    def finish(self, ended_by: str, detail: str = "") -> Verification:
        """The verdict when output ends without one: the server came up (``ready``), the
        startup time ran out (``timeout``) or the engine exited (``exited``)."""
        if self.verdict is not None:
            return self.verdict
        if ended_by != "ready":
            self.problems.append(detail)
        return self._end(ended_by)

    def _end(self, ended_by: str) -> Verification:
        expected, seen = self.expected, self.seen
        if ended_by == "ready":
            if "config_line" not in seen:
                self.problems.append(
                    "the engine came up without logging its config ('Initializing a V1 LLM "
                    "engine ... with config'): cudagraph_mode and mode are unconfirmed"
                )
            if self.formats.runner_v2 is None:  # one runner, and no line says it
                seen.setdefault("runner", self.release.runners[0])
                seen.setdefault("runner_line", f"vLLM {self.release.version} has "
                                f"{self.release.runners[0]} only")
            seen.setdefault("runner", "mrv1")  # V1 is the runner that logs nothing
            if expected["runner"] != seen["runner"] and self.formats.runner_v2 is None:
                self.problems.append(
                    f"runner: decided {expected['runner']}, but vLLM {self.release.version} "
                    f"has {seen['runner']} only"
                )
            elif expected["runner"] == "mrv2" and seen["runner"] != "mrv2":
                self.problems.append(
                    f"runner: decided mrv2, but the engine came up without logging "
                    f"{RUNNER_V2_MESSAGE!r}: it runs V1"
                )
            seen.setdefault("breakable", False)
            if expected["breakable"] and expected["cudagraph_mode"] != "NONE" and not (
                seen["breakable"]
            ):
                self.problems.append(
                    f"breakable: decided true, but the engine came up without logging "
                    f"{BREAKABLE_MESSAGE!r}"
                )
        verdict = Verification(
            verified=not self.problems,
            expected=dict(expected),
            seen=dict(seen),
            problems=list(self.problems),
            ended_by=ended_by,
            vllm_version=seen.get("vllm_version", self.version),
            formats={
                "for_version": self.version,
                "version": self.release.version,
                **{name: (str(cite) if cite else None)
                   for name, cite in vars(self.formats).items()},
            },
        )
        self.verdict = verdict
        return verdict
