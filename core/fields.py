"""The context's vocabulary: trait kinds, and scalar values as a policy spells them.

The decision's fields are :mod:`interlock.core.decision`'s.
"""

from __future__ import annotations

ATTENTION_KINDS = ("mha", "gqa", "mla", "dsa", "linear", "hybrid")
#: What the engine runs the model for (vLLM's runner type, with encoder-decoder models apart):
#: ``draft`` is a speculative-decoding draft loaded beside its target.
TASKS = ("generate", "pooling", "draft", "encoder-decoder")

#: Trait key -> allowed values (a tuple) or the Python type of a free value.
TRAITS: dict[str, tuple[str, ...] | type] = {
    "moe": bool,
    "attention": ATTENTION_KINDS,
    "mtp": bool,
    "quantized": bool,
    "family": str,
    "task": TASKS,
    #: A multimodal wrapper's text model (its config's ``text_config.architectures[0]``):
    #: vLLM 0.34.0 matches its breakable defaults on it too (``hf_text_config``).
    "text_architecture": str,
}


def parse_scalar(text: str) -> bool | int | float | str:
    """Type a ``--feature K=V`` value: booleans, integers, floats, else the string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{text!r} is not a finite number")
        return value
    return text


def show_scalar(value: object) -> str:
    """A value as the policy's YAML spells it (``true``/``false`` for booleans), for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
