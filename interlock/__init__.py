"""interlock: declarative platform policy for LLM inference, with pluggable runner backends.

The repository keeps ``policy/``, ``runners/``, ``kernels/`` and ``plugins/`` at its root;
they install and import as ``interlock.policy``, ``interlock.runners``, ``interlock.kernels``
and ``interlock.plugins`` (pyproject.toml's package-dir mapping: each file has one path), so no
bare ``policy`` or ``kernels`` ever reaches site-packages.
"""

from typing import Any

__version__ = "0.2.0"

#: Names ``from interlock import ...`` gives, as vLLM's ``from vllm import LLM, SamplingParams``
#: does, and the module each lives in. Imported on first use only: ``import interlock`` (and
#: ``interlock.policy``, which never imports torch) must stay light; and by name, not by an
#: import statement, so the package's root stays below every layer (the import contract).
_LAZY = {"LLM": "interlock.llm", "SamplingParams": "interlock.runners.batching.sampling"}
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'interlock' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
