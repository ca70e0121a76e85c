"""A Hugging Face ``config.json`` read into the :class:`ModelConfig` the runners execute.

Torch-free. What differs between families (defaults of omitted keys, which
keys switch biases, windows and routed experts) is declared by each family's
module in ``interlock.runners.model.families``; keys a family may leave out
take the defaults transformers gives them, so a config means the same model
here as there. This module sits above the families, which declare their rules
on the types of :mod:`interlock.runners.model.config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from interlock.core.decision import DTYPES
from interlock.core.files import FileProblem, read_json
from interlock.core.terminal import shown
from interlock.policy.context import MAX_CONFIG_BYTES
from interlock.runners.model import families
from interlock.runners.model.config import (
    MAX_SCALE,
    ROPE_TYPES,
    Bad,
    ConfigError,
    ModelConfig,
    RawConfig,
    RopeConfig,
    finite,
)

#: Bounds of the sizes a config.json may declare, far above any released model (126 layers,
#: 10 M positions), so that a hostile value is refused by name before it reaches an
#: allocation or a native call.
MAX_LAYERS = 4096
MAX_POSITIONS = 1 << 26
#: A window is an int32 in the native kernels.
MAX_WINDOW = (1 << 31) - 1
#: The largest ``rms_norm_eps`` (released models: 1e-6..1e-5); past it the norm divides by
#: the epsilon rather than the activations' size.
MAX_EPS = 1.0


def load_config(model_dir: str | Path) -> ModelConfig:
    """Parse ``<model_dir>/config.json`` (eos ids from generation_config.json when present)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: no config.json in model directory {model_dir}")
    raw = _read_json(path)
    generation = Path(model_dir) / "generation_config.json"
    if generation.is_file():
        eos = _read_json(generation).get("eos_token_id")
        if eos is not None:
            raw = {**raw, "eos_token_id": eos}
    return parse_config(raw, source=str(path))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = read_json(path, MAX_CONFIG_BYTES)
    except FileProblem as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def parse_config(raw: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from config.json contents; ``source`` names it in errors."""
    architectures = raw.get("architectures")
    if not architectures or not isinstance(architectures, list):
        raise ConfigError(f"{source}: 'architectures' must be a non-empty list")
    architecture = architectures[0]
    if not isinstance(architecture, str):
        raise ConfigError(f"{source}: architectures[0] must be a string, got {architecture!r}")
    family = families.family(architecture)
    if family is None:
        raise ConfigError(
            f"{source}: architecture {shown(architecture)} is not supported; supported: "
            + ", ".join(families.architectures())
        )
    raw = {**raw}
    for alias, key in family.aliases.items():
        # transformers' attribute_map: the config.json it writes spells the key ``alias``.
        if alias in raw and key not in raw:
            raw[key] = raw.pop(alias)
    try:
        cfg = RawConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{source}: {problems}") from exc

    def bad(key: str, value: object, allowed: str) -> ConfigError:
        return ConfigError(f"{source}: {key}={value!r} is not supported; allowed: {allowed}")

    if cfg.hidden_act != "silu":
        raise bad("hidden_act", cfg.hidden_act, "silu")
    defaults = family.defaults
    num_heads = cfg.num_attention_heads
    max_positions = cfg.max_position_embeddings
    if max_positions is None:
        max_positions = defaults.max_position_embeddings
    elif not 1 <= max_positions <= MAX_POSITIONS:  # 0 is not "unset": refuse it, not guess
        raise bad("max_position_embeddings", max_positions, f"an integer in 1..{MAX_POSITIONS}")
    if cfg.num_hidden_layers > MAX_LAYERS:
        raise bad("num_hidden_layers", cfg.num_hidden_layers, f"an integer in 1..{MAX_LAYERS}")
    rope = _rope(cfg, defaults.rope_theta, max_positions, bad)
    mla = None if family.mla is None else family.mla(cfg, rope, bad)
    if mla is not None:
        # Every head reads the one latent: num_key_value_heads means nothing to MLA (the
        # configs transformers writes carry its default, 128, whatever the heads), and the
        # rotary table spans the rope part of a head (transformers sets head_dim to it).
        num_kv_heads, head_dim = num_heads, mla.qk_rope_head_dim
    else:
        num_kv_heads = cfg.num_key_value_heads or defaults.num_key_value_heads or num_heads
        if num_heads % num_kv_heads:
            raise bad("num_key_value_heads", num_kv_heads,
                      f"a divisor of num_attention_heads={num_heads}")
        head_dim = cfg.head_dim or defaults.head_dim or cfg.hidden_size // num_heads
        if head_dim == 0:
            raise bad("hidden_size", cfg.hidden_size,
                      f"at least num_attention_heads={num_heads} (head_dim is hidden_size // "
                      "num_attention_heads), or a head_dim")
    if head_dim % 2:
        # The rotary embedding turns pairs of dimensions; the kernels assume it.
        key = "qk_rope_head_dim" if mla is not None else (
            "head_dim" if cfg.head_dim or defaults.head_dim else
            "head_dim (hidden_size // num_attention_heads)"
        )
        raise bad(key, head_dim, "an even number (rotary embeddings turn pairs of dimensions)")
    eps = defaults.rms_norm_eps if cfg.rms_norm_eps is None else cfg.rms_norm_eps
    eps = finite("rms_norm_eps", eps, bad, positive=True, at_most=MAX_EPS)
    if cfg.layer_types is not None and len(cfg.layer_types) != cfg.num_hidden_layers:
        raise bad(
            "layer_types", f"<{len(cfg.layer_types)} entries>",
            f"one entry per layer ({cfg.num_hidden_layers}, num_hidden_layers)",
        )
    special = [("bos_token_id", cfg.bos_token_id)] if cfg.bos_token_id is not None else []
    special += [("eos_token_id", t) for t in _eos_ids(cfg.eos_token_id)]
    for key, token in special:
        if not 0 <= token < cfg.vocab_size:
            raise bad(key, token, f"a token id in [0, {cfg.vocab_size}) (vocab_size)")
    if cfg.sliding_window is not None and not 0 <= cfg.sliding_window <= MAX_WINDOW:
        raise bad("sliding_window", cfg.sliding_window,
                  f"null, or a window in 1..{MAX_WINDOW} tokens (0: none)")
    qkv_bias = defaults.qkv_bias
    if family.bias_key is not None and getattr(cfg, family.bias_key) is not None:
        qkv_bias = getattr(cfg, family.bias_key)
    return ModelConfig(
        architecture=architecture,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=eps,
        max_position_embeddings=max_positions,
        rope=rope,
        tie_word_embeddings=cfg.tie_word_embeddings,
        qkv_bias=qkv_bias,
        o_bias=qkv_bias and family.bias_on_output,
        mlp_bias=cfg.mlp_bias and family.reads_mlp_bias,
        qk_norm=family.qk_norm,
        sliding_windows=family.windows(
            cfg,
            cfg.sliding_window if "sliding_window" in cfg.model_fields_set
            else defaults.sliding_window,
            bad,
        ),
        moe=None if family.moe is None else family.moe(cfg, family, bad),
        mla=mla,
        dtype=_checkpoint_dtype(cfg, bad),
        initializer_range=finite("initializer_range", cfg.initializer_range, bad, at_least=0),
        bos_token_id=cfg.bos_token_id,
        eos_token_ids=_eos_ids(cfg.eos_token_id),
        mtp_layers=(cfg.num_nextn_predict_layers or 0) if family.mtp_layers else 0,
        dsa=None if family.dsa is None else family.dsa(cfg, mla, bad),
        linear=None if family.linear is None else family.linear(cfg, bad),
    )


def _rope(cfg: RawConfig, default_theta: float, max_positions: int, bad: Bad) -> RopeConfig:
    # transformers 5 writes rope_parameters; older checkpoints write rope_theta + rope_scaling.
    # With both, transformers takes a non-empty rope_scaling (convert_rope_params_to_dict:
    # ``rope_scaling or rope_parameters``); so do we, or the same file would be two models.
    params = dict(cfg.rope_scaling or cfg.rope_parameters or {})
    theta = params.get("rope_theta", cfg.rope_theta)
    theta = finite("rope_theta", theta if theta is not None else default_theta, bad, positive=True)
    partial = params.get("partial_rotary_factor", cfg.partial_rotary_factor)
    if partial not in (None, 1, 1.0):
        raise bad("partial_rotary_factor", partial, "1.0 (full rotary)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise bad("rope type", kind, ", ".join(ROPE_TYPES))
    if kind == "default":
        return RopeConfig(theta=theta)

    def number(key: str, default: float | None = None, positive: bool = False,
               at_least: float | None = None, at_most: float | None = None) -> float | None:
        value = params.get(key, default)
        return None if value is None else finite(f"rope {kind} {key}", value, bad,
                                                 positive=positive, at_least=at_least,
                                                 at_most=at_most)

    factor = number("factor", positive=True)
    if factor is None:
        raise bad(f"rope {kind} factor", None, "a number > 0")
    original = params.get("original_max_position_embeddings")
    if kind in ("llama3", "yarn") and original is None:
        original = max_positions
    if original is not None and (
        not isinstance(original, int) or isinstance(original, bool)
        or not 1 <= original <= MAX_POSITIONS
    ):
        raise bad(f"rope {kind} original_max_position_embeddings", original,
                  f"an integer in 1..{MAX_POSITIONS}")
    low = number("low_freq_factor", 1.0, positive=True)
    high = number("high_freq_factor", 4.0, positive=True)
    if kind == "llama3" and low is not None and high is not None and not high > low:
        # The smoothing between the two wavelengths divides by their difference.
        raise bad("rope llama3 high_freq_factor", high, f"a number > low_freq_factor={low}")
    return RopeConfig(
        theta=theta,
        type=kind,
        factor=factor,
        original_max_position_embeddings=original,
        low_freq_factor=low if low is not None else 1.0,
        high_freq_factor=high if high is not None else 4.0,
        beta_fast=number("beta_fast", positive=True) or 32.0,
        beta_slow=number("beta_slow", positive=True) or 1.0,
        attention_factor=number("attention_factor", positive=True, at_most=MAX_SCALE),
        mscale=number("mscale", at_least=0, at_most=MAX_SCALE),
        mscale_all_dim=number("mscale_all_dim", at_least=0, at_most=MAX_SCALE),
        truncate=bool(params.get("truncate", True)),
    )


def _checkpoint_dtype(cfg: RawConfig, bad: Bad) -> str:
    dtype = cfg.dtype or cfg.torch_dtype or "float32"
    dtype = dtype.removeprefix("torch.")
    if dtype not in DTYPES:
        raise bad("dtype", dtype, ", ".join(DTYPES))
    return dtype


def _eos_ids(eos: int | list[int] | None) -> tuple[int, ...]:
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)
