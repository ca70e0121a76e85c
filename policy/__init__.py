"""interlock's policy engine: which runner and CUDA-graph strategy, decided from policies.yaml.

The public API is loaded lazily so that ``import policy`` stays cheap::

    from policy import load_policy, make_context, resolve
    res = resolve(load_policy(), make_context("GlmMoeDsaForCausalLM", platform="rocm"))
    res.decision.runner, res.provenance["runner"].source
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "PolicyError": "policy.errors",
    "Policy": "policy.model",
    "load_policy": "policy.loader",
    "load_policy_text": "policy.loader",
    "Context": "policy.context",
    "make_context": "policy.context",
    "Decision": "policy.resolution",
    "Resolution": "policy.resolution",
    "resolve": "policy.resolution",
    "parse_when": "policy.conditions",
    "Facts": "policy.conditions",
}

__all__ = [
    "Context",
    "Decision",
    "Facts",
    "Policy",
    "PolicyError",
    "Resolution",
    "__version__",
    "load_policy",
    "load_policy_text",
    "make_context",
    "parse_when",
    "resolve",
]

if TYPE_CHECKING:
    from policy.conditions import Facts, parse_when
    from policy.context import Context, make_context
    from policy.errors import PolicyError
    from policy.loader import load_policy, load_policy_text
    from policy.model import Policy
    from policy.resolution import Decision, Resolution, resolve


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'policy' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
