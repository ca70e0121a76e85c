"""GGUF's block-quantized weights, kept quantized: their formats, and the layout the
quantized products take them in (``pack``), for the native kernels and their references.

A GGUF file stores a linear weight [N, K] row by row in blocks of its type (``FORMATS``).
``pack`` decodes them into integer quants and float32 scales (and offsets), as the
``gguf`` package dequantizes them, and lays them out in strips of ``PACK_STRIP`` outputs
(the scales stored as the file's float16 where the format's are, ``Format.half``):
strip s and block b (``Format.block`` inputs) is one record of ``Format.record`` bytes,
records back to back, so that a product streams the weight front to back (the head of
``kernels/native/quantized.c`` describes a record). Weight (n, k) is then
``d q + m``, which ``dequantize`` computes bitwise as ``gguf.quants.dequantize`` does.

Torch only: the model source hands the file's bytes in as a uint8 tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from interlock.kernels.packing import PACK_STRIP

#: The record kinds (the C code's QBYTES_*): 4-bit quants with offsets, or signed bytes;
#: HALF is added where the scales (and offsets) are float16, INT8 where the quants are
#: regrouped for the products on int8 activations (``INT8_FORMATS``).
NIBBLES, SIGNED, HALF, INT8 = 0, 1, 2, 4


@dataclass(frozen=True)
class Format:
    """A GGML block type as the quantized kernels take it."""

    name: str  # the GGML name, e.g. "Q4_1"
    kind: int  # NIBBLES or SIGNED
    block: int  # inputs per record (a scale per output per block)
    file_block: int  # inputs per block in the file (256 for the K-quants)
    file_bytes: int  # bytes per block in the file
    # the record holds the scales (and offsets) as float16: the file's own values (Q4_1,
    # Q8_0), which a product at one row then streams 17 % / 6 % fewer bytes of; float32
    # where they are computed at load (Q4_0's -8 d, which float16 could overflow, and the
    # K-quants' products of two scales)
    half: bool = False
    # the quants regrouped for the products on int8 activations (kernels/native/int8.c):
    # line g of a record (64 bytes) holds q[c][4 g .. 4 g + 3] in the low nibbles of bytes
    # 4 c .. 4 c + 3 and q[c][16 + 4 g ..] in the high ones, one output's four inputs a lane
    int8: bool = False

    @property
    def scale_bytes(self) -> int:
        """Bytes of a record's scales and offsets (nibbles), before its quants."""
        return (32 if self.half else 64) * (2 if self.kind == NIBBLES else 1)

    @property
    def record(self) -> int:
        """Bytes of one record: scales, offsets (nibbles), then the quants of 16 outputs."""
        return self.scale_bytes + (8 if self.kind == NIBBLES else 16) * self.block

    @property
    def code(self) -> int:
        """The record kind as the C kernels take it."""
        return self.kind | (HALF if self.half else 0) | (INT8 if self.int8 else 0)

    @property
    def label(self) -> str:
        return self.name.lower()


FORMATS = {f.name: f for f in (
    Format("Q8_0", SIGNED, 32, 32, 34, half=True),
    Format("Q4_0", NIBBLES, 32, 32, 18),
    Format("Q4_1", NIBBLES, 32, 32, 20, half=True),
    Format("Q4_K", NIBBLES, 32, 256, 144),
    Format("Q6_K", SIGNED, 16, 256, 210),
)}


#: The formats whose products can take int8 activations, in their records for them: Q4_1's
#: regrouped, Q8_0's its own (a tied head's rows serve the embedding as they are).
INT8_FORMATS = {"Q4_1": Format("Q4_1", NIBBLES, 32, 32, 20, half=True, int8=True),
                "Q8_0": FORMATS["Q8_0"]}

#: Inputs per block of an int8 activation row (one scale and one float sum each).
INT8_BLOCK = 32


class QuantFormatError(ValueError):
    """A quantized tensor the kernels cannot take as it is, naming why."""


def format_of(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise QuantFormatError(
            f"no quantized kernels for {name}; they take {', '.join(FORMATS)}"
        ) from None


def int8_format_of(name: str) -> Format:
    """The regrouped records of ``name`` for the products on int8 activations."""
    try:
        return INT8_FORMATS[name]
    except KeyError:
        raise QuantFormatError(
            f"no int8-activation products for {name}; they take {', '.join(INT8_FORMATS)}"
        ) from None


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows x [T, K] (float32, K a multiple of 32) rounded to 8 bits per block of 32 inputs,
    as the native int8 products round them: x_q = rint(x / d) (x times 1 / d, ties to even)
    with d = max|x| / 127 per block (0 for a block of zeros), and each block's float sum.
    Returns x_q [T, K] (int8), d [T, K / 32] and the sums [T, K / 32]."""
    rows, inputs = x.shape
    blocks = x.reshape(rows, inputs // INT8_BLOCK, INT8_BLOCK)
    d = blocks.abs().amax(dim=-1) / 127
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    xq = torch.round(blocks * inverse.unsqueeze(-1)).to(torch.int8).reshape(rows, inputs)
    return xq, d, blocks.sum(dim=-1)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian float16 from the last dimension's byte pairs, as float32."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Bytes [..., n] -> their low nibbles, then their high ones: [..., 2 n]."""
    return torch.cat((qs & 15, qs >> 4), dim=-1)


def decode(raw: torch.Tensor, name: str, inputs: int) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A weight's file bytes [N, row bytes] (uint8) -> quants [N, K] (uint8 for nibble
    formats, int8 else), scales [N, K / block] and offsets (None for signed formats), so
    that weight (n, k) is scale q + offset in float32, as gguf dequantizes it. A NaN or
    infinite scale or offset (float16 bits in the file) is refused, as the dequantized
    weight it would make is."""
    q, scale, offset = _decode(raw, name, inputs)
    for what, values in (("scale", scale), ("offset", offset)):
        if values is None or bool(torch.isfinite(values.sum(dtype=torch.float32))):
            continue
        bad = int((~torch.isfinite(values)).sum())
        if bad:
            raise QuantFormatError(f"{name}: {bad} NaN or infinite block {what}(s)")
    return q, scale, offset


def _decode(raw: torch.Tensor, name: str, inputs: int) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor | None]:
    fmt = format_of(name)
    if inputs % fmt.file_block:
        raise QuantFormatError(
            f"{name}: {inputs} inputs are not whole blocks of {fmt.file_block} (a partial "
            "block has no quantized layout)")
    rows = raw.shape[0]
    blocks = inputs // fmt.file_block
    if raw.dtype is not torch.uint8 or raw.shape[1:] != (blocks * fmt.file_bytes,):
        raise QuantFormatError(
            f"{name}: {tuple(raw.shape)} {raw.dtype} is not [rows, {blocks * fmt.file_bytes}] "
            f"bytes for {inputs} inputs")
    b = raw.reshape(rows, blocks, fmt.file_bytes)
    if name == "Q8_0":
        return b[..., 2:].contiguous().view(torch.int8).reshape(rows, inputs), \
            _f16(b[..., :2]).reshape(rows, blocks), None
    if name in ("Q4_0", "Q4_1"):
        d = _f16(b[..., :2])
        start = 2 if name == "Q4_0" else 4
        m = -8 * d if name == "Q4_0" else _f16(b[..., 2:4])  # exact: d (q - 8) = d q - 8 d
        return _nibbles(b[..., start:]).reshape(rows, inputs), d.reshape(rows, blocks), \
            m.reshape(rows, blocks)
    if name == "Q4_K":
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _k4_scales(b[..., 4:16])
        qs = b[..., 16:].reshape(rows, blocks, 4, 32)  # 4 pieces of 64: low nibbles, high
        q = torch.stack((qs & 15, qs >> 4), dim=3).reshape(rows, inputs)
        scale = (d * sc.to(torch.float32)).reshape(rows, blocks * 8)
        offset = -(dmin * mn.to(torch.float32)).reshape(rows, blocks * 8)
        return q, scale, offset
    # Q6_K: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 sub-block scales, d.
    ql, qh = b[..., :128], b[..., 128:192]
    sc = b[..., 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = _f16(b[..., 208:210])
    halves = ql.reshape(rows, blocks, 2, 64)  # each half: 128 weights, as 4 pieces of 32
    low = torch.stack((halves & 15, halves >> 4), dim=3).reshape(rows, blocks, 2, 4, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 1, 4, 1)
    high = (qh.reshape(rows, blocks, 2, 1, 32) >> shifts) & 3
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(rows, inputs)
    return q, (d * sc).reshape(rows, blocks * 16), None


def _k4_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 bytes -> its 8 six-bit sub-block scales and 8 mins (uint8)."""
    lo, hi, top = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    scales = torch.cat((lo & 63, (top & 15) | ((lo >> 6) << 4)), dim=-1)
    mins = torch.cat((hi & 63, (top >> 4) | ((hi >> 6) << 4)), dim=-1)
    return scales, mins


def pack(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
         fmt: Format) -> torch.Tensor:
    """Quants, scales and offsets (``decode``) -> the records [N / 16, K / block, record]
    (uint8) the quantized products stream."""
    rows, inputs = q.shape
    if rows % PACK_STRIP:
        raise QuantFormatError(
            f"{fmt.name}: {rows} outputs are not a multiple of {PACK_STRIP} (a strip)")
    L = fmt.block
    strips, blocks = rows // PACK_STRIP, inputs // L

    def per_strip(v: torch.Tensor) -> torch.Tensor:  # [N, nb] float32 -> [S, nb, 64 | 32]
        if fmt.half:  # the file's float16 values: a scale that is not one would round
            half = v.to(torch.float16)
            exact = (half.to(torch.float32) == v) | (v.isnan() & half.isnan())
            if not bool(exact.all()):
                raise QuantFormatError(
                    f"{fmt.name}: a scale or offset is not a float16 value (its records hold "
                    "the file's float16 values)")
            v = half
        return v.reshape(strips, PACK_STRIP, blocks).transpose(1, 2).contiguous() \
            .view(torch.uint8)

    # quants as [S, nb, lines, 16]: line j, byte c = output 16 s + c
    qb = q.reshape(strips, PACK_STRIP, blocks, L).permute(0, 2, 3, 1)
    if fmt.kind == NIBBLES:
        if offset is None:
            raise QuantFormatError(f"{fmt.name}: 4-bit records take offsets")
        lines = (qb[:, :, : L // 2] | (qb[:, :, L // 2:] << 4)).to(torch.uint8)
        if fmt.int8:  # [S, nb, 16 j, 16 c] -> [S, nb, 4 g, 16 c, 4 i], j = 4 g + i
            lines = lines.reshape(strips, blocks, 4, 4, PACK_STRIP).transpose(3, 4)
        parts = [per_strip(scale), per_strip(offset)]
    else:
        lines = qb.contiguous().view(torch.uint8)
        parts = [per_strip(scale)]
    parts.append(lines.reshape(strips, blocks, -1))
    return torch.cat(parts, dim=-1)


def unpack(packed: torch.Tensor, name: str, int8: bool = False) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Records (``pack``; the regrouped ones of ``INT8_FORMATS`` if ``int8``) -> the quants
    [N, K] as float32, the scales [N, K / block] and the offsets (None for signed formats)."""
    fmt = int8_format_of(name) if int8 else format_of(name)
    strips, blocks, record = packed.shape
    if packed.dtype is not torch.uint8 or record != fmt.record:
        raise QuantFormatError(
            f"{name}: records {tuple(packed.shape)} {packed.dtype} are not {fmt.record} "
            "bytes each")
    L = fmt.block
    width = 2 if fmt.half else 4
    rows = strips * PACK_STRIP

    def floats(i: int) -> torch.Tensor:  # scales (0) or offsets (1): [N, nb]
        at = i * PACK_STRIP * width
        raw = packed[..., at:at + PACK_STRIP * width].contiguous()
        values = raw.view(torch.float16 if fmt.half else torch.float32).to(torch.float32)
        return values.transpose(1, 2).reshape(rows, blocks)  # [S, nb, 16] -> [N, nb]

    quants = packed[..., fmt.scale_bytes:]
    if fmt.kind == NIBBLES:
        if fmt.int8:  # back to [S, nb, 16 j, 16 c] from [S, nb, 4 g, 16 c, 4 i]
            quants = quants.reshape(strips, blocks, 4, PACK_STRIP, 4).transpose(3, 4)
        lines = quants.reshape(strips, blocks, L // 2, PACK_STRIP)
        q = torch.cat((lines & 15, lines >> 4), dim=2).to(torch.float32)
    else:
        q = quants.contiguous().view(torch.int8).reshape(
            strips, blocks, L, PACK_STRIP).to(torch.float32)
    # [S, nb, L, 16] -> [S, 16, nb, L] -> [N, K]
    q = q.permute(0, 3, 1, 2).reshape(rows, blocks * L)
    return q, floats(0), floats(1) if fmt.kind == NIBBLES else None


def dequantize(packed: torch.Tensor, name: str, int8: bool = False) -> torch.Tensor:
    """Records (``pack``) -> the float32 weight [N, K]: d q + m per weight, in float32; of
    the regrouped records (``INT8_FORMATS``) if ``int8``."""
    q, scale, offset = unpack(packed, name, int8)
    rows, inputs = q.shape
    blocks = scale.shape[1]
    w = scale.unsqueeze(-1) * q.view(rows, blocks, inputs // blocks)
    if offset is not None:
        w = w + offset.unsqueeze(-1)
    return w.reshape(rows, inputs)


def shape_of(packed: torch.Tensor, name: str) -> tuple[int, int]:
    """(outputs, inputs) of a packed weight."""
    fmt = format_of(name)
    if packed.dim() != 3 or packed.dtype is not torch.uint8 or packed.shape[2] != fmt.record:
        raise QuantFormatError(
            f"{name}: {tuple(packed.shape)} {packed.dtype} is not packed {name} records "
            f"[out / {PACK_STRIP}, in / {fmt.block}, {fmt.record}] (uint8)")
    return packed.shape[0] * PACK_STRIP, packed.shape[1] * fmt.block
