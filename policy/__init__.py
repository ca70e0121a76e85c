"""interlock's policy engine: which runner and CUDA-graph strategy, decided from policies.yaml.

The public API is loaded lazily so that ``import policy`` stays cheap::

    from interlock.policy import load_policy, make_context, resolve
    res = resolve(load_policy(), make_context("GlmMoeDsaForCausalLM", platform="rocm"))
    res.decision.runner, res.provenance["runner"].source
"""

from __future__ import annotations

if __name__ == "policy":  # the checkout root on sys.path: see core/bare_name.py
    from interlock.core.bare_name import hand_over

    hand_over(__name__, __file__)
else:
    from typing import TYPE_CHECKING, Any

    from interlock import __version__

    _EXPORTS = {
        "PolicyError": "interlock.core.errors",
        "Policy": "interlock.policy.model",
        "load_policy": "interlock.policy.loader",
        "load_policy_text": "interlock.policy.loader",
        "Context": "interlock.policy.context",
        "make_context": "interlock.policy.context",
        "Decision": "interlock.core.decision",
        "Resolution": "interlock.policy.resolution",
        "resolve": "interlock.policy.resolution",
        "PolicyRefused": "interlock.policy.resolution",
        "check_refusal": "interlock.policy.resolution",
        "parse_when": "interlock.policy.schema",
        "Facts": "interlock.policy.conditions",
    }

    __all__ = [
        "Context",
        "Decision",
        "Facts",
        "Policy",
        "PolicyError",
        "PolicyRefused",
        "Resolution",
        "__version__",
        "check_refusal",
        "load_policy",
        "load_policy_text",
        "make_context",
        "parse_when",
        "resolve",
    ]

    if TYPE_CHECKING:
        from interlock.core.decision import Decision
        from interlock.core.errors import PolicyError
        from interlock.policy.conditions import Facts
        from interlock.policy.context import Context, make_context
        from interlock.policy.loader import load_policy, load_policy_text
        from interlock.policy.model import Policy
        from interlock.policy.resolution import (
            PolicyRefused,
            Resolution,
            check_refusal,
            resolve,
        )
        from interlock.policy.schema import parse_when


    def __getattr__(name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'policy' has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
