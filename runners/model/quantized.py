"""A GGUF model's block-quantized weights kept quantized (``weights`` native or int8), or not.

The conversion of a GGUF file (``runners.model.gguf``) holds the quantized matrices' own
bytes in ``quantized.safetensors`` beside the float32 checkpoint. With ``weights``
``native`` (or ``auto`` where the quantized kernels run natively) each linear weight whose
checkpoint tensors are all quantized in one format the kernels take, in whole strips of 16
rows, is repacked (``kernels.quant``) into the weight itself before the float checkpoint
is read; the float tensor it replaces is never written, so its memory is never touched.
The rest loads as floats, each with its reason. ``dequantize`` loads everything as floats
(what every other backend takes). ``int8`` keeps them as ``native`` does, but packs the
Q4_1 weights in the records of the products on int8 activations (``quant.INT8_FORMATS``),
which round each row to 8 bits per block, and the Q8_0 ones (a tied head's too) in their
own records for the same products: the other formats keep their own products. Under
tensor parallelism each rank keeps its shard
quantized: its output rows, or, for a row-parallel product, its inputs in whole records.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import torch

from interlock.kernels import quant
from interlock.kernels.native import BACKEND as NATIVE
from interlock.kernels.native import int8_isa, quantized_isa
from interlock.runners.dispatch import KernelTable
from interlock.runners.model.decoder import CausalLM
from interlock.runners.model.layers import Linear
from interlock.runners.model.safetensors_format import data_offsets
from interlock.runners.model.sharding import Shard
from interlock.runners.model.weights import CheckpointError

#: The conversion's file of quantized bytes, and the metadata key naming their types.
QUANTIZED = "quantized.safetensors"
GGML_TYPES_KEY = "ggml_types"
#: Rows decoded and repacked at a time (whole strips): the load holds the records and one
#: slice's temporaries, not a whole tensor's (SmolLM2's 49,152-row embedding: ~30 MB
#: of bytes, and its quants and scales decoded, several times that while it is packed).
PACK_ROWS = 1024


def read_rows(file: BinaryIO, start: int, rows: int, width: int) -> torch.Tensor:
    """``rows`` rows of ``width`` bytes from ``start`` in ``file``, as uint8 [rows, width]:
    read, not mapped, so that once repacked their memory is given back (pages of a mapped
    file stay in the process's resident set until the mapping ends)."""
    size = rows * width
    data = os.pread(file.fileno(), size, start)
    if len(data) != size:
        raise OSError(f"the file ends {size - len(data)} bytes before the tensor does")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(rows, width)


@dataclass
class KeptWeights:
    """What ``keep_quantized`` did: the checkpoint tensors it filled, and why per format."""

    names: set[str] = field(default_factory=set)
    # "native q4_1" -> its reason; "dequantized" -> why the rest (if any) are floats
    decisions: dict[str, str] = field(default_factory=dict)


def weights_mode(requested: str, directory: Path | None, ops: KernelTable, dtype: str
                 ) -> tuple[bool, str]:
    """Whether to keep quantized weights (``requested``: auto, native, int8 or dequantize),
    and why. A native or int8 request that cannot be honoured is a ``CheckpointError``
    naming why."""
    if requested == "dequantize":
        return False, "dequantized at load: weights dequantize was asked for"
    has_file = directory is not None and (directory / QUANTIZED).is_file()
    choice = ops.choice("quantized_linear")
    why_not = (
        None if has_file else "the model is not a GGUF file's conversion with quantized weights"
    ) or (None if dtype == "float32" else f"the quantized products compute in float32, not {dtype}"
          )
    if why_not is None and requested == "auto" and choice.impl.backend != NATIVE:
        why_not = f"no native quantized kernels here ({choice.reason})"
    if why_not is None:
        return True, f"kept quantized: {choice.label} quantized_linear ({choice.reason})"
    if requested in ("native", "int8"):
        raise CheckpointError(f"weights {requested} cannot be honoured: {why_not}")
    return False, f"dequantized at load: {why_not}"


def keep_quantized(model: CausalLM, directory: Path, int8: bool = False) -> KeptWeights:
    """Repack every linear weight (and the embedding table) the quantized products can
    take from ``directory``'s ``quantized.safetensors`` into the model, before the float
    checkpoint is loaded; the tensors filled are in the result, for the loader to skip.
    With ``int8``, the linear weights of a format in ``quant.INT8_FORMATS`` are packed for
    the products on int8 activations."""
    from safetensors import SafetensorError, safe_open

    path = directory / QUANTIZED
    try:
        handle = safe_open(path, framework="pt")
        types: dict[str, str] = json.loads((handle.metadata() or {})[GGML_TYPES_KEY])
        starts = data_offsets(path)
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a conversion's quantized weights ({exc})") from None
    kept = KeptWeights()
    counts: Counter[str] = Counter()
    floats: list[str] = []

    def packed(name: str, inputs: int, shard: Shard | None = None,
               regrouped: bool = False) -> torch.Tensor:
        """The file's tensor ``name`` as records (``regrouped``: for int8 activations); of
        this rank's ``shard`` only (its output rows, or its inputs: whole records,
        ``_why_float`` has checked)."""
        try:
            fmt = (quant.int8_format_of if regrouped else quant.format_of)(types[name])
            found = handle.get_slice(name)
            shape, dtype = tuple(found.get_shape()), found.get_dtype()
            if dtype != "U8" or len(shape) != 2:
                raise quant.QuantFormatError(f"holds {dtype} {list(shape)}, not rows of bytes")
            rows, width = shape
            first, last = (shard.start, shard.stop) if shard and shard.dim == 0 else (0, rows)
            wanted = shard.stop - shard.start if shard and shard.dim == 1 else inputs
            records = torch.empty(
                (last - first) // quant.PACK_STRIP, wanted // fmt.block, fmt.record,
                dtype=torch.uint8)
            with open(path, "rb", buffering=0) as file:  # one open per tensor, read by slices
                for lo in range(first, last, PACK_ROWS):
                    hi = min(lo + PACK_ROWS, last)
                    records[(lo - first) // quant.PACK_STRIP:(hi - first) // quant.PACK_STRIP] = (
                        _repacked(read_rows(file, starts[name] + lo * width, hi - lo, width),
                                  fmt, inputs, shard))
            return records
        except (quant.QuantFormatError, SafetensorError, OSError) as exc:  # a damaged file
            raise CheckpointError(f"{path}: tensor {name}: {exc}") from None

    slots = list(model.checkpoint_slots())
    for module in model.modules():
        if not isinstance(module, Linear) or module.transposed or module.weight.dim() != 2:
            continue
        weight = module.weight
        parts = sorted(
            ((view.storage_offset() - weight.storage_offset()) // module.in_features, name,
             view.shape[0], shard)
            for name, view, shard in slots
            if name.endswith(".weight")
            and view.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
        )
        why = _why_float(parts, types, module.in_features, module.out_features)
        if why is not None:
            floats.extend(f"{name}: {why}" for _, name, _, _ in parts)
            continue
        kind = types[parts[0][1]]
        regrouped = int8 and kind in quant.INT8_FORMATS
        module.keep_quantized(
            torch.cat([packed(name, module.in_features, shard, regrouped)
                       for _, name, _, shard in parts]),
            kind, regrouped)
        kept.names.update(name for _, name, _, _ in parts)
        counts[f"{kind} int8" if regrouped else kind] += len(parts)
    table = "model.embed_tokens.weight"
    vocab, hidden = model.embedding.shape
    why = _why_float([(0, table, vocab, None)], types, hidden, vocab)
    if why is None and model.tp.size == 1:
        # the head's product takes int8 activations only where the head is this table
        regrouped = int8 and types[table] in quant.INT8_FORMATS and model.lm_head is None
        model.keep_quantized_embedding(packed(table, hidden, regrouped=regrouped), types[table],
                                       regrouped)
        kept.names.add(table)
        counts[f"{types[table]} int8" if regrouped else types[table]] += 1
    elif table in types:
        floats.append(f"{table}: {why or 'sharded across ranks'}")
    # where the products are the native ones, which instruction set they run
    native = counts and model.ops.choice("quantized_linear").impl.backend == NATIVE
    where = f" ({quantized_isa()})" if native else ""
    for name, count in sorted(counts.items()):
        if name.endswith(" int8"):
            product = model.ops.choice("quantized_linear_int8")
            isa = f", {int8_isa()}" if product.impl.backend == NATIVE else ""
            kept.decisions[f"native {name.lower()}"] = (
                f"weights kept quantized ({count} tensors), in records for int8 activations: "
                f"each row rounded to 8 bits per block of 32, integer dot products "
                f"({product.impl.backend}{isa})")
            continue
        more = (f"; weights int8: no int8-activation products for {name} (they take "
                f"{', '.join(quant.INT8_FORMATS)})" if int8 and name not in quant.INT8_FORMATS
                else "")
        kept.decisions[f"native {name.lower()}"] = (
            f"weights kept quantized ({count} tensors), dequantized in registers inside "
            f"the products{where}{more}")
    if floats:
        kept.decisions["dequantized"] = "; ".join(floats)
    return kept


def _repacked(raw: torch.Tensor, fmt: quant.Format, inputs: int, shard: Shard | None
              ) -> torch.Tensor:
    """A slice of a tensor's rows of file bytes as records; of ``shard``'s inputs only when
    the shard splits the inputs (``_why_float`` has checked they are whole records)."""
    if shard is None or shard.dim != 1:
        return quant.pack(*quant.decode(raw, fmt.name, inputs), fmt)
    q, scale, offset = quant.decode(raw, fmt.name, shard.full)
    cols = slice(shard.start, shard.stop)
    blocks = slice(shard.start // fmt.block, shard.stop // fmt.block)
    return quant.pack(q[:, cols].contiguous(), scale[:, blocks].contiguous(),
                      None if offset is None else offset[:, blocks].contiguous(), fmt)


def _why_float(parts: list[tuple[int, str, int, Shard | None]], types: dict[str, str],
               inputs: int, outputs: int) -> str | None:
    """Why a weight filled by ``parts`` (start row, name, rows, this rank's shard of the
    file's tensor) stays float, or None."""
    if not parts or any(name not in types for _, name, _, _ in parts):
        return "not quantized in the file"
    kinds = {types[name] for _, name, _, _ in parts}
    if len(kinds) > 1:
        return f"fused from tensors of different formats ({', '.join(sorted(kinds))})"
    kind = kinds.pop()
    if kind not in quant.FORMATS:
        return f"no quantized kernels for {kind}"
    fmt = quant.FORMATS[kind]
    if any(start % quant.PACK_STRIP or rows % quant.PACK_STRIP for start, _, rows, _ in parts):
        return f"its rows are not whole strips of {quant.PACK_STRIP}"
    if sum(rows for _, _, rows, _ in parts) != outputs:
        return "the file's tensors do not fill it"
    for _, _, _, shard in parts:
        if shard is None:
            continue
        if shard.stop > shard.full:
            return "this rank's shard is padded past the tensor"
        if shard.dim == 1 and (shard.full % fmt.file_block or shard.start % fmt.block
                               or shard.stop % fmt.block):
            return (f"this rank's inputs {shard.start}:{shard.stop} of {shard.full} are not "
                    f"whole {kind} records of {fmt.block}")
        if shard.dim not in (0, 1):
            return f"it is split along dim {shard.dim}"
    if not any(shard is not None and shard.dim == 1 for *_, shard in parts) and \
            inputs % fmt.file_block:
        return f"{inputs} inputs are not whole {kind} blocks"
    return None
