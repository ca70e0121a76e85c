"""interlock: declarative platform policy for LLM inference, with pluggable runner backends.

The repository keeps ``policy/``, ``runners/``, ``kernels/`` and ``plugins/`` at its root;
they install and import as ``interlock.policy``, ``interlock.runners``, ``interlock.kernels``
and ``interlock.plugins`` (pyproject.toml's package-dir mapping: each file has one path), so no
bare ``policy`` or ``kernels`` ever reaches site-packages.
"""

__version__ = "0.2.0"
