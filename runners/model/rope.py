"""Rotary embedding tables for the ``rotary_embedding`` op, with the scalings these families use.

Frequencies are computed in float32 exactly as transformers computes them,
so positions rotate bit-identically to the oracle.
"""

from __future__ import annotations

import math

import torch

from interlock.runners.model.config import RopeConfig


def cos_sin_cache(rope: RopeConfig, head_dim: int, max_positions: int) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half of each row, sin in the second."""
    if torch.get_default_device().type == "meta":
        # Shapes only (sizing a model, listing its tensors): a meta tensor holds no values, and
        # the first arange on meta imports torch's Python meta kernels, seconds for nothing.
        return torch.empty(max_positions, head_dim, dtype=torch.float32)
    inv_freq, scaling = inverse_frequencies(rope, head_dim)
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos() * scaling, freqs.sin() * scaling], dim=-1)


def inverse_frequencies(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim/2] float32, factor applied to cos and sin)."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.type == "default":
        return inv_freq, 1.0
    if rope.type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.type == "llama3":
        return _llama3(rope, inv_freq), 1.0
    if rope.type == "yarn":
        return _yarn(rope, dim, exponents)
    raise ValueError(f"rope type {rope.type!r} has no frequency rule")


def _original_context(rope: RopeConfig) -> int:
    """The context the checkpoint was trained at, which llama3 and yarn scale from
    (parse_config fills it in for both)."""
    if rope.original_max_position_embeddings is None:
        raise ValueError(f"rope type {rope.type!r} needs original_max_position_embeddings")
    return rope.original_max_position_embeddings


def _llama3(rope: RopeConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    """Long wavelengths divided by factor, short ones kept, a smooth ramp in between."""
    context = _original_context(rope)
    low_freq_wavelen = context / rope.low_freq_factor
    high_freq_wavelen = context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(rope: RopeConfig, dim: int, exponents: torch.Tensor) -> tuple[torch.Tensor, float]:
    """NTK-by-parts interpolation with the attention temperature of the YaRN paper."""
    factor = rope.factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        context = _original_context(rope)
        return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = rope.theta**exponents
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)
