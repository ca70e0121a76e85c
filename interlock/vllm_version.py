"""Which vLLM ``policy vllm`` is about to exec, and which of its knobs that release reads.

The version is read from the executable's own interpreter: ``vllm`` is a console
script whose shebang names the Python of the environment vLLM is installed in,
and that interpreter's ``importlib.metadata`` says which vLLM it has. interlock
never imports vLLM itself (it may not be installed here, and importing it is slow
and binds a platform).

:data:`VLLM_KNOBS` is the flag-support table: each environment variable or flag
``policy vllm`` sets, the decision field it carries, and the releases that read
it (PEP 440 specifier sets), established by reading each release's wheel
(``vllm/envs.py``, ``vllm/config/compilation.py``). A release that lacks a knob
gets no value for it; a decision only that knob could carry there is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from interlock.core.errors import PolicyError

#: Seconds the interpreter may take to report a version (importlib.metadata is fast).
DETECT_TIMEOUT = 30
#: A shebang longer than this is not one (the kernel reads 256 bytes; pip writes longer
#: paths through a /bin/sh trampoline).
MAX_SHEBANG = 4096
#: The oldest release the table below was established for; older ones are refused.
OLDEST_KNOWN = "0.16.0"

_QUERY = (
    "import importlib.metadata as m, json\n"
    "try:\n"
    "    print(json.dumps({'version': m.version('vllm')}))\n"
    "except m.PackageNotFoundError:\n"
    "    print(json.dumps({'version': None}))\n"
)


class DetectionError(PolicyError):
    """The executable's interpreter could not be found or asked (exit 1, like other input)."""


@dataclass(frozen=True)
class Knob:
    """An environment variable or ``vllm serve`` flag that carries one decision field."""

    name: str
    kind: str  # "env" or "flag"
    field: str
    #: The releases that read it.
    releases: str
    #: The value the field has in a release without the knob (vLLM cannot do otherwise there),
    #: or None when such a release has no fixed value for it.
    without: Any
    #: Where the range was established.
    evidence: str

    def read_by(self, version: str) -> bool:
        return SpecifierSet(self.releases).contains(version, prereleases=True)


VLLM_KNOBS: tuple[Knob, ...] = (
    Knob(
        "VLLM_USE_V2_MODEL_RUNNER", "env", "runner", ">=0.16.0", None,
        "vllm/envs.py of 0.16.0, 0.19.0-0.22.0 and 0.26.0-0.33.0",
    ),
    Knob(
        "VLLM_USE_BREAKABLE_CUDAGRAPH", "env", "breakable", ">=0.22.0", False,
        "vllm/envs.py: absent in 0.16.0, 0.19.0, 0.20.2 and 0.21.0, read from 0.22.0 on",
    ),
    Knob(
        "-cc.cudagraph_mode", "flag", "cudagraph", ">=0.16.0", None,
        "CompilationConfig.cudagraph_mode in vllm/config/compilation.py of 0.16.0-0.33.0",
    ),
    Knob(
        "-cc.mode", "flag", "compile", ">=0.16.0", None,
        "CompilationConfig.mode in vllm/config/compilation.py of 0.16.0-0.33.0",
    ),
)


def knob(name: str) -> Knob:
    return next(k for k in VLLM_KNOBS if k.name == name)


def unsupported(version: str | None, decision: Mapping[str, Any]) -> list[tuple[Knob, str]]:
    """The knobs this release does not read, each with why the decision is still honoured
    there (empty text) or why it cannot be (the refusal)."""
    if version is None:
        return []
    out = []
    for k in VLLM_KNOBS:
        if k.read_by(version):
            continue
        value = decision.get(k.field)
        if k.without is not None and value == k.without:
            out.append((k, ""))
        else:
            shown = str(value).lower() if isinstance(value, bool) else str(value)
            out.append(
                (k, f"vLLM {version} does not read {k.name} ({k.releases}; {k.evidence}), so "
                    f"it cannot run {k.field}={shown}")
            )
    return out


def check_known(version: str) -> None:
    """Refuse a release older than the flag table covers: what it reads is not established."""
    if Version(version) < Version(OLDEST_KNOWN):
        raise PolicyError(
            f"vLLM {version} is older than the oldest release interlock's flag table covers "
            f"({OLDEST_KNOWN}): which of its flags and env vars carry the decision is not "
            "established; upgrade vLLM or pass the flags yourself"
        )


def interpreter_of(executable: Path) -> list[str]:
    """The command line of the interpreter a script's shebang names (``#!/venv/bin/python``,
    ``#!/usr/bin/env python3``, or pip's ``/bin/sh`` trampoline for long paths)."""
    try:
        with open(executable, "rb") as f:
            head = f.read(MAX_SHEBANG)
    except OSError as exc:
        raise DetectionError(
            f"cannot read {executable}: {exc.strerror or exc}", file=str(executable)
        ) from None
    if not head.startswith(b"#!"):
        raise DetectionError(
            "not a script with a shebang, so its interpreter is unknown (give "
            "--engine-version vllm=X.Y.Z)",
            file=str(executable),
        )
    lines = head.decode("utf-8", "replace").splitlines()
    words = lines[0][2:].split()
    if words and Path(words[0]).name in ("sh", "bash") and len(lines) > 1:
        # pip: #!/bin/sh, then '''exec' "/long path/python" "$0" "$@"
        second = lines[1]
        if second.startswith("'''exec' "):
            rest = second[len("'''exec' "):].strip()
            path = rest[1:].split('"', 1)[0] if rest.startswith('"') else rest.split()[0]
            words = [path]
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if not words or not Path(words[0]).name.startswith("python"):
        raise DetectionError(
            f"its shebang names {' '.join(words) or 'nothing'}, not a Python interpreter "
            "(give --engine-version vllm=X.Y.Z)",
            file=str(executable),
        )
    return words


def detect_engine_version(executable: str | os.PathLike[str]) -> Version | None:
    """vLLM's version in the environment of ``executable`` (the ``vllm`` script), read by
    that script's own interpreter through ``importlib.metadata``; None when that
    interpreter has no vLLM. Raises :class:`DetectionError` when it cannot be asked."""
    path = Path(executable)
    command = interpreter_of(path)
    try:
        proc = subprocess.run(
            [*command, "-I", "-c", _QUERY],
            capture_output=True, text=True, timeout=DETECT_TIMEOUT, check=False,
        )  # fmt: skip
    except FileNotFoundError:
        raise DetectionError(
            f"the interpreter {command[0]} its shebang names does not exist", file=str(path)
        ) from None
    except subprocess.TimeoutExpired:
        raise DetectionError(
            f"{command[0]} did not report vLLM's version within {DETECT_TIMEOUT} s",
            file=str(path),
        ) from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    try:
        text = json.loads(lines[-1])["version"] if proc.returncode == 0 and lines else ""
    except (ValueError, KeyError, TypeError):
        text = ""
    if text is None:
        return None
    try:
        return Version(text)
    except (InvalidVersion, TypeError):
        tail = " ".join(proc.stderr.split())[-200:]
        raise DetectionError(
            f"{command[0]} did not report a vLLM version (exit {proc.returncode}"
            + (f": {tail}" if tail else "") + ")",
            file=str(path),
        ) from None


def detected_source(executable: str | os.PathLike[str]) -> str:
    """How a detected version is shown among the context's facts."""
    command = interpreter_of(Path(executable))
    return f"detected (importlib.metadata of {command[0]}, the interpreter of {executable})"
