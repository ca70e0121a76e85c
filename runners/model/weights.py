"""A checkpoint's weights: reading safetensors files (one, or the shards an index lists)
and filling a model's slots with them.

Every tensor the model needs must be present with exactly its shape, and every
tensor present must be used: anything else is an error naming the tensor, the
expected and the found shape. A whole tensor is read from the file into its slot
(:meth:`SafetensorsFiles.copy_into`); a tensor-parallel rank reads only its rows of
each split tensor (safetensors slices the memory-mapped file without materialising
the whole tensor).
"""

from __future__ import annotations

import ctypes
import math
import struct
from collections.abc import Set
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import SafetensorError, safe_open

from interlock.core.errors import ModelError
from interlock.core.files import FileProblem, check_regular, read_json
from interlock.policy.context import MAX_CONFIG_BYTES
from interlock.runners.model import families
from interlock.runners.model.decoder import CausalLM
from interlock.runners.model.family import layer_tensor_kind
from interlock.runners.model.safetensors_format import data_offsets
from interlock.runners.model.sharding import Shard

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Buffers some older checkpoints saved; transformers recomputes and ignores them.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
_MAX_LISTED = 8


class CheckpointError(ModelError):
    """A model that cannot be loaded as asked, with the offending value and what is allowed."""


class TensorSource(Protocol):
    origin: str  # where the tensors come from, for error messages

    def names(self) -> set[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def get(self, name: str, shard: Shard | None = None) -> torch.Tensor:
        """The tensor, or only its rows ``shard.start:min(shard.stop, shard.full)``."""
        ...

    def copy_into(self, name: str, out: torch.Tensor) -> None:
        """The whole tensor written into ``out`` (its shape; cast to its dtype)."""
        ...


def shard_index(shard: Shard) -> tuple[slice, ...]:
    """The index selecting a shard's rows that exist (padding rows past ``full`` do not)."""
    return (slice(None),) * shard.dim + (slice(shard.start, min(shard.stop, shard.full)),)


#: Stored dtypes a weight may have (safetensors' names); integers or booleans cast into
#: float weights would load silently as a different model.
STORED_FLOATS = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16
}
FLOAT_DTYPES = tuple(STORED_FLOATS)
#: The most a tensor that needs a cast or a transposition is staged at a time.
STAGING_BYTES = 16 * 2**20


class SafetensorsFiles:
    """Tensors of ``model.safetensors`` or of the shards an index file lists.

    A checkpoint is untrusted: every file it names must be a regular file inside
    the model directory (no absolute paths, ``..`` or links leading out of it;
    a Hugging Face cache snapshot's links into its own ``blobs`` are inside),
    and a damaged file or index is an error naming it, never a crash.
    """

    def __init__(self, directory: Path) -> None:
        index = directory / SAFETENSORS_INDEX
        single = directory / SAFETENSORS
        if index.is_file():
            weight_map = _read_weight_map(index)
            self.files = {
                name: _shard_path(directory, index, name, file)
                for name, file in weight_map.items()
            }
            self.origin = str(index)
        elif single.is_file():
            path = _shard_path(directory, single, None, SAFETENSORS)
            self.files = dict.fromkeys(self._open(path).keys(), path)
            self.origin = str(single)
        else:
            raise CheckpointError(
                f"{directory}: no weights found; expected {SAFETENSORS} or {SAFETENSORS_INDEX} "
                "(or load_format='dummy')"
            )
        # One memory-mapped handle per file, opened on first use.
        self._handles: dict[Path, Any] = {}
        # Where each tensor's bytes start in its file, from the file's header.
        self._offsets: dict[Path, dict[str, int]] = {}
        # Reused for the tensors that cannot be read straight into their slot.
        self._staging = torch.empty(0, dtype=torch.uint8)

    def names(self) -> set[str]:
        return set(self.files)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def dtype(self, name: str) -> str:
        """The stored dtype, as safetensors spells it (``F32``, ``BF16``, ``I32``, ``BOOL``)."""
        return str(self._slice(name).get_dtype())

    def get(self, name: str, shard: Shard | None = None) -> torch.Tensor:
        try:
            if shard is None:
                return self._handle(name).get_tensor(name)
            return self._slice(name)[shard_index(shard)]
        except SafetensorError as exc:
            raise CheckpointError(f"{self.files[name]}: tensor {name}: {exc}") from None

    def copy_into(self, name: str, out: torch.Tensor) -> None:
        """Read the tensor's bytes from the file, into ``out`` itself when it is a contiguous
        CPU tensor of the stored dtype, else a few rows at a time into a small reused
        staging buffer, each chunk then copied (cast, transposed) into ``out``.

        Reading, not mapping: a mapped file's pages would be faulted in one by one and stay
        in the process's resident set for the whole load (mapping made a warm SmolLM2 load
        slow, and put a bfloat16 load's peak memory near that of float32 weights)."""
        stored = STORED_FLOATS[self.dtype(name)]
        shape = self.shape(name)
        if tuple(out.shape) != shape:
            raise CheckpointError(
                f"{self.files[name]}: tensor {name} has shape {shape}, expected {tuple(out.shape)}"
            )
        if out.dtype == stored and out.device.type == "cpu" and out.is_contiguous():
            self._read(name, out, 0)
            return
        if not shape:  # a scalar: one element, no rows to chunk
            value = torch.empty((), dtype=stored)
            self._read(name, value, 0)
            out.copy_(value)
            return
        row_bytes = math.prod(shape[1:]) * stored.itemsize
        step = max(1, STAGING_BYTES // max(row_bytes, 1))
        for start in range(0, shape[0], step):
            rows = min(step, shape[0] - start)
            nbytes = rows * row_bytes
            if self._staging.numel() < nbytes:
                self._staging = torch.empty(nbytes, dtype=torch.uint8)
            chunk = self._staging[:nbytes].view(stored).view(rows, *shape[1:])
            self._read(name, chunk, start * row_bytes)
            out[start : start + rows].copy_(chunk)

    def _read(self, name: str, target: torch.Tensor, skip: int) -> None:
        """Fill contiguous CPU ``target`` from tensor ``name``'s bytes, ``skip`` bytes in."""
        path = self.files[name]
        nbytes = target.numel() * target.element_size()
        if nbytes == 0:
            return
        buffer = memoryview((ctypes.c_char * nbytes).from_address(target.data_ptr())).cast("B")
        with open(path, "rb", buffering=0) as fh:
            fh.seek(self._data_offset(path, name) + skip)
            done = 0
            while done < nbytes:
                got = fh.readinto(buffer[done:])
                if not got:
                    raise CheckpointError(
                        f"{path}: tensor {name}: the file ends {nbytes - done} bytes early "
                        "(truncated)"
                    )
                done += got

    def _data_offset(self, path: Path, name: str) -> int:
        """The file offset of ``name``'s bytes. safetensors validated the header when the
        file was opened (offsets in order, inside the file, sized by dtype and shape); this
        reads where they are."""
        if path not in self._offsets:
            try:
                self._offsets[path] = data_offsets(path)
            except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
                raise CheckpointError(f"{path}: unreadable safetensors header ({exc})") from None
        return self._offsets[path][name]

    def _slice(self, name: str) -> Any:
        try:
            return self._handle(name).get_slice(name)
        except SafetensorError as exc:
            raise CheckpointError(
                f"{self.files[name]}: tensor {name}: {exc} (the index {self.origin} lists it "
                "in this file)"
            ) from None

    def _handle(self, name: str) -> Any:
        file = self.files[name]
        if file not in self._handles:
            self._handles[file] = self._open(file)
        return self._handles[file]

    @staticmethod
    def _open(path: Path) -> Any:
        try:
            return safe_open(path, framework="pt")
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(
                f"{path}: not a readable safetensors file ({exc}); the file is truncated, "
                "empty or damaged"
            ) from None


def _shard_path(directory: Path, origin: Path, tensor: str | None, file: object) -> Path:
    """The file a checkpoint names, checked to be a regular file inside ``directory``."""
    where = f"{origin}: weight_map[{tensor!r}]" if tensor is not None else str(origin)
    if not isinstance(file, str) or not file:
        raise CheckpointError(f"{where}: a shard must be a file name, got {file!r}")
    relative = Path(file)
    if relative.is_absolute() or ".." in relative.parts:
        raise CheckpointError(
            f"{where}: shard {file!r} is outside the model directory; a checkpoint may only "
            "name files inside it"
        )
    path = directory / relative
    real, root = path.resolve(), directory.resolve()
    # A Hugging Face cache snapshot links its files to <repo>/blobs: that is still the model.
    roots = [root]
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    if not any(real.is_relative_to(r) for r in roots):
        raise CheckpointError(
            f"{where}: shard {file!r} leads outside the model directory (to {real}); a "
            "checkpoint may only name files inside it"
        )
    try:
        check_regular(path, str(path))
    except FileProblem as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    return path


def _read_weight_map(index: Path) -> dict[str, object]:
    try:
        weight_map = read_json(index, MAX_CONFIG_BYTES)["weight_map"]
    except FileProblem as exc:
        raise CheckpointError(str(exc)) from None
    except (KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{index}: not a safetensors index with a 'weight_map': {exc!r}"
        ) from None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: 'weight_map' must map tensor names to shard files")
    return weight_map


def full_shape(view: torch.Tensor, shard: Shard | None) -> tuple[int, ...]:
    """The checkpoint tensor's shape a slot expects (the whole tensor, not the shard)."""
    shape = list(view.shape)
    if shard is not None:
        shape[shard.dim] = shard.full
    return tuple(shape)


def load_weights(
    model: CausalLM, source: TensorSource, filled: Set[str] = frozenset()
) -> None:
    """Copy every checkpoint tensor (or this rank's rows of it) into its slot, after
    checking names and whole shapes; ``filled`` names tensors already in the model (kept
    quantized: ``runners.model.quantized``)."""
    slots = {name: (view, shard) for name, view, shard in model.checkpoint_slots()}
    expected_shapes = {name: full_shape(view, shard) for name, (view, shard) in slots.items()}
    found = source.names()
    config = model.config
    mtp = tuple(f"model.layers.{config.num_layers + i}." for i in range(config.mtp_layers))
    ignored = {n for n in found if n.endswith(_IGNORED_SUFFIXES) or n.startswith(mtp)}
    ignored |= filled
    if config.tie_word_embeddings:
        ignored.add("lm_head.weight")  # tied: the embedding is the head, as in transformers
    family = families.family(config.architecture)
    shape_keys = family.shape_keys if family is not None else {}

    def keys(name: str) -> str:
        named = shape_keys.get(layer_tensor_kind(name) or "")
        return f" (shape from config.json: {', '.join(named)})" if named else ""

    problems = [
        f"missing tensor {name} (expected shape {expected_shapes[name]}){keys(name)}"
        for name in sorted(set(slots) - found)
    ]
    problems += [
        f"unexpected tensor {name} (shape {source.shape(name)}){keys(name)}"
        for name in sorted(found - set(slots) - ignored)
    ]
    for name in sorted(set(slots) & found):
        expected, actual = expected_shapes[name], source.shape(name)
        if expected != actual:
            problems.append(f"tensor {name} has shape {actual}, expected {expected}{keys(name)}")
    if problems:
        listed = problems[:_MAX_LISTED]
        if len(problems) > _MAX_LISTED:
            listed.append(f"... and {len(problems) - _MAX_LISTED} more")
        raise CheckpointError(
            f"{source.origin} does not match {model.config.architecture}: " + "; ".join(listed)
        )
    dtype_of = getattr(source, "dtype", None)  # what the file stores (dummy weights: floats)
    with torch.no_grad():
        for name, (slot, shard) in slots.items():
            if dtype_of is not None and dtype_of(name) not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"{source.origin}: tensor {name} is stored as {dtype_of(name)}; weights "
                    f"must be floating point ({', '.join(FLOAT_DTYPES)})"
                )
            whole = shard is None or (shard.start, shard.stop) == (0, shard.full)
            if shard is None or whole:
                source.copy_into(name, slot)
                loaded = slot
            else:
                tensor = source.get(name, shard)
                present = tensor.shape[shard.dim]
                loaded = slot.narrow(shard.dim, 0, present)
                loaded.copy_(tensor)
                slot.narrow(shard.dim, present, slot.shape[shard.dim] - present).zero_()
            _check_finite(source.origin, name, loaded, whole)


def _check_finite(origin: str, name: str, weight: torch.Tensor, whole: bool) -> None:
    """NaN or infinite weights (in the file, or from casting it to a narrower dtype) would
    generate garbage (token 0 over and over) without a word. Either makes the sum
    non-finite: one pass over the weight just written, no temporary its size; the exact
    count tells a finite overflow of the sum apart."""
    if bool(torch.isfinite(weight.sum(dtype=torch.float32))):
        return
    bad = int((~torch.isfinite(weight)).sum())
    if bad:
        dtype = str(weight.dtype).removeprefix("torch.")
        raise CheckpointError(
            f"{origin}: tensor {name} holds {bad} NaN or infinite value(s) as {dtype}"
            + ("" if whole else " in this rank's rows")
        )


def checkpoint_shapes(model: CausalLM) -> dict[str, tuple[int, ...]]:
    """Name and (whole) shape of every checkpoint tensor the model needs."""
    return {name: full_shape(view, shard) for name, view, shard in model.checkpoint_slots()}
