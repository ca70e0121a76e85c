"""Every ``INTERLOCK_*`` environment variable interlock reads, defined once.

A module reads a variable by its entry here (``os.environ.get(CACHE_DIR.name)``), so a
name is spelled in one place; ``tests/core/test_env_registry.py`` checks that the source
names no other ``INTERLOCK_*`` variable and that docs/operators.md's table is this one.
How each value is parsed stays with the module that reads it: that module's error names
the variable and the values it allows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, the values it takes, what it does, and the
    page that documents it."""

    name: str
    values: str
    effect: str
    doc: str


POLICY = EnvVar(
    "INTERLOCK_POLICY", "a policy file or a stack a.yaml:b.yaml (@shipped: the shipped one)",
    "the policy every command, the LLM API and the vLLM plugin decide with, when no "
    "--policy is given", "docs/operators.md",
)
DECISION_LOG = EnvVar(
    "INTERLOCK_DECISION_LOG", "a file path",
    "appends a decision record for every decision made (also inside vLLM)",
    "docs/decision-records.md",
)
CACHE_DIR = EnvVar(
    "INTERLOCK_CACHE_DIR", "a private directory",
    "where parsed policies, plugin discovery, converted checkpoints and measurement records are "
    "cached (default $XDG_CACHE_HOME/interlock, else ~/.cache/interlock)", "docs/security.md",
)
API_KEY = EnvVar(
    "INTERLOCK_API_KEY", "a non-empty key",
    "policy serve requires `Authorization: Bearer KEY` on /v1 (when --api-key is not given)",
    "docs/serve.md",
)
DISABLE_PLUGINS = EnvVar(
    "INTERLOCK_DISABLE_PLUGINS", "plugin names or distribution:plugin, comma-separated",
    "leaves those plugins out of discovery", "docs/plugins.md",
)
PLUGINS_STRICT = EnvVar(
    "INTERLOCK_PLUGINS_STRICT", "0 or 1",
    "1: a plugin that fails to load, conflicts or provides a bad kernel stops the command "
    "instead of being quarantined", "docs/plugins.md",
)
NO_PLUGIN_CACHE = EnvVar(
    "INTERLOCK_NO_PLUGIN_CACHE", "set and non-empty",
    "plugin discovery runs every time instead of reading its cache", "docs/plugins.md",
)
KERNELS = EnvVar(
    "INTERLOCK_KERNELS", "a kernel backend (torch, triton, native or a plugin's)",
    "that backend must serve every op it implements", "docs/kernels.md",
)
DEBUG_GRAPHS = EnvVar(
    "INTERLOCK_DEBUG_GRAPHS", "1 (any value but empty or 0)",
    "the debug graph backend wherever the backend is auto, for an LLM that does not say "
    "(policy run --debug-graphs and LLM(debug_graphs=True) ask for it)",
    "docs/runners-and-graphs.md",
)
GRAPHS_FAIL_CAPTURE = EnvVar(
    "INTERLOCK_GRAPHS_FAIL_CAPTURE", "all, or capture sizes like 4,8",
    "forces those graph captures to fail (for tests of the fallback)",
    "docs/runners-and-graphs.md",
)
TP_COLLECTIVES = EnvVar(
    "INTERLOCK_TP_COLLECTIVES", "auto, shm or gloo",
    "how tensor-parallel ranks exchange tensors on CPU (shm that cannot be honoured is an "
    "error)", "docs/scaling-out.md",
)
TP_TIMEOUT = EnvVar(
    "INTERLOCK_TP_TIMEOUT", "seconds in (0, 86400); default 30",
    "the bound on every collective and on the rendezvous", "docs/scaling-out.md",
)
TP_THREADS = EnvVar(
    "INTERLOCK_TP_THREADS", "threads per rank, 1..4096",
    "torch threads of each tensor-parallel rank on CPU (default: the host's cores shared "
    "among its ranks)", "docs/scaling-out.md",
)
TP_NAMESPACE = EnvVar(
    "INTERLOCK_TP_NAMESPACE", "a name shared by one run's ranks",
    "under torchrun, the namespace of the run's rendezvous keys (default torchrun's run id)",
    "docs/scaling-out.md",
)

#: The registry, in the order docs/operators.md lists it.
VARIABLES: tuple[EnvVar, ...] = (
    POLICY, DECISION_LOG, CACHE_DIR, API_KEY, DISABLE_PLUGINS, PLUGINS_STRICT,
    NO_PLUGIN_CACHE, KERNELS, DEBUG_GRAPHS, GRAPHS_FAIL_CAPTURE, TP_COLLECTIVES, TP_TIMEOUT,
    TP_THREADS, TP_NAMESPACE,
)


def table() -> str:
    """The registry as the Markdown table docs/operators.md carries."""
    rows = ["| variable | values | effect | documented in |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.values} | {v.effect} | [{v.doc.removeprefix('docs/')}]"
             f"({v.doc.removeprefix('docs/')}) |" for v in VARIABLES]
    return "\n".join(rows)
