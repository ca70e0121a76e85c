"""The vocabulary of a policy: decision fields, their allowed values, and trait kinds.

Plain data with plain checks, so the resolver, overrides and env bindings share
one definition with the pydantic schema without importing pydantic.
"""

from __future__ import annotations

import re

CUDAGRAPH_MODES = ("none", "piecewise", "full", "full_decode_only", "full_and_piecewise")
ATTENTION_KINDS = ("mha", "gqa", "mla", "dsa", "linear", "hybrid")

#: Decision fields in output order; ``capture_sizes`` is optional.
DECISION_FIELDS = ("runner", "cudagraph", "breakable", "compile", "capture_sizes")
REQUIRED_FIELDS = ("runner", "cudagraph", "breakable", "compile")
#: Not a field: whether a decision is made at all (an engine may refuse a context).
OUTCOME = "outcome"

#: Trait key -> allowed values (a tuple) or the Python type of a free value.
TRAITS: dict[str, tuple[str, ...] | type] = {
    "moe": bool,
    "attention": ATTENTION_KINDS,
    "mtp": bool,
    "quantized": bool,
    "family": str,
}

RUNNER_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")

FieldValue = str | bool | tuple[int, ...]
#: No batch of one step is larger (a graph per size is captured: 1e20 is a mistake).
MAX_CAPTURE_SIZE = 65536


def allowed_values(name: str) -> str:
    """Human text of what ``name`` accepts, for error messages."""
    if name == "runner":
        return "a runner name such as mrv1, mrv2 (lowercase letters, digits, _)"
    if name == "cudagraph":
        return ", ".join(CUDAGRAPH_MODES)
    if name in ("breakable", "compile"):
        return "true, false"
    if name == "capture_sizes":
        return f"a list of distinct integers from 1 to {MAX_CAPTURE_SIZE}, e.g. 1,2,4,8"
    raise KeyError(name)


def check_field(name: str, value: object) -> FieldValue:
    """Validate a typed decision-field value; returns it normalised (lists -> tuples).

    Raises ``ValueError`` naming the field, the value and the allowed values.
    """
    if name not in DECISION_FIELDS:
        raise ValueError(_unknown_field(name))
    ok = False
    if name == "runner":
        ok = isinstance(value, str) and bool(RUNNER_NAME.match(value))
    elif name == "cudagraph":
        ok = value in CUDAGRAPH_MODES
    elif name in ("breakable", "compile"):
        ok = isinstance(value, bool)
    elif isinstance(value, (list, tuple)) and value:
        ok = all(type(v) is int and 0 < v <= MAX_CAPTURE_SIZE for v in value)
        ok = ok and len(set(value)) == len(value)
        value = tuple(value)
    if not ok:
        raise ValueError(f"{name}: bad value {value!r}; allowed: {allowed_values(name)}")
    return value  # type: ignore[return-value]


def parse_field(name: str, text: str) -> FieldValue:
    """Parse ``--set name=text`` into a typed, validated value."""
    if name not in DECISION_FIELDS:
        raise ValueError(_unknown_field(name))
    value: object = text
    lowered = text.strip().lower()
    if name in ("breakable", "compile"):
        value = True if lowered in _TRUE else False if lowered in _FALSE else text
    elif name == "capture_sizes":
        try:
            value = [int(part) for part in text.split(",")]
        except ValueError:
            value = text
    try:
        return check_field(name, value)
    except ValueError:  # echo what the user typed, not the parsed form
        raise ValueError(
            f"{name}: bad value {text!r}; allowed: {allowed_values(name)}"
        ) from None


def _unknown_field(name: str) -> str:
    from interlock.core.suggest import hint

    allowed = ", ".join(DECISION_FIELDS)
    return f"unknown decision field {name!r}; allowed: {allowed}{hint(name, DECISION_FIELDS)}"


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
