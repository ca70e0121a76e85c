"""Every ``INTERLOCK_*`` environment variable interlock reads, defined once.

A module reads a variable by its entry here (``os.environ.get(CACHE_DIR.name)``), so a
name is spelled in one place; ``tests/core/test_env_registry.py`` checks that the source
names no other ``INTERLOCK_*`` variable and that docs/operators.md's table is this one.
How each value is parsed stays with the module that uses it: that module's error names
the variable and the values it allows.

What a run uses (the kernel backend forced, the graph captures made to fail, how
tensor-parallel ranks exchange tensors, their bound and threads) is read once, where the run
starts (``LLM(...)``, a torchrun worker), into :class:`Settings`, and handed down with the
run: nothing reads the environment for it after the decision
(``tests/app/test_environment_read_once.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field


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

@dataclass(frozen=True)
class Settings:
    """The ``INTERLOCK_*`` values a run uses, read once where it starts (:meth:`read`); each
    is the variable's text (None: unset), parsed where it is used, in an error naming it."""

    #: :data:`KERNELS`: the backend that must serve every op it implements.
    kernels: str | None = None
    #: :data:`DEBUG_GRAPHS`: set to anything but empty or 0.
    debug_graphs: bool = False
    #: :data:`GRAPHS_FAIL_CAPTURE`: the captures made to fail.
    graphs_fail_capture: str | None = None
    #: :data:`TP_COLLECTIVES`, :data:`TP_TIMEOUT`, :data:`TP_THREADS`, :data:`TP_NAMESPACE`.
    tp_collectives: str | None = None
    tp_timeout: str | None = None
    tp_threads: str | None = None
    tp_namespace: str | None = None
    #: :data:`PLUGINS_STRICT`: 1 stops at a plugin failure instead of quarantining it.
    plugins_strict: bool = False
    #: :data:`DECISION_LOG`: where decision records are appended.
    decision_log: str | None = None
    #: The whole environment as it was read (the policy's env bindings, plugin discovery).
    environ: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The values of ``environ`` (this process's environment unless given)."""
        environ = dict(os.environ if environ is None else environ)
        return cls(
            kernels=environ.get(KERNELS.name) or None,
            debug_graphs=environ.get(DEBUG_GRAPHS.name, "") not in ("", "0"),
            graphs_fail_capture=environ.get(GRAPHS_FAIL_CAPTURE.name),
            tp_collectives=environ.get(TP_COLLECTIVES.name),
            tp_timeout=environ.get(TP_TIMEOUT.name),
            tp_threads=environ.get(TP_THREADS.name),
            tp_namespace=environ.get(TP_NAMESPACE.name) or None,
            plugins_strict=environ.get(PLUGINS_STRICT.name) == "1",
            decision_log=environ.get(DECISION_LOG.name) or None,
            environ=environ,
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
