"""The decision on vLLM's ``/metrics``: a stat-logger plugin (entry-point group
``vllm.stat_logger_plugins``, loaded by the API server process, where the config was built
and :mod:`interlock.vllm.plugin` decided). It exports one info metric,
``interlock_decision_info{runner, cudagraph_mode, compile_mode, breakable, rule,
policy_revision} 1``, through prometheus_client's registry, which vLLM serves. Imports
vLLM: loaded only inside it.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Gauge
from vllm.v1.metrics.loggers import StatLoggerBase

from interlock.vllm.plugin import APPLIED, PluginRefusal, compile_mode_name

METRIC = "interlock_decision_info"
LABELS = ("runner", "cudagraph_mode", "compile_mode", "breakable", "rule", "policy_revision")
#: One gauge per process: a second logger (another engine index) reuses it.
_GAUGE: list[Gauge] = []


def labels_of(platform: str) -> dict[str, str]:
    """The metric's labels for the decision this process applied."""
    if not APPLIED:
        raise PluginRefusal(
            "the stat logger found no decision in this process: the config was built "
            "without the interlock plugin's seam running (is the general plugin disabled "
            "by VLLM_PLUGINS?)"
        )
    made = APPLIED[-1]
    decision = made.decision
    return {
        "runner": str(decision["runner"]),
        "cudagraph_mode": str(decision["cudagraph"]).upper(),
        "compile_mode": compile_mode_name(bool(decision["compile"]), platform),
        "breakable": "true" if decision["breakable"] else "false",
        "rule": made.rule_ids(),
        "policy_revision": str(made.resolution.policy.revision),
    }


class DecisionInfo(StatLoggerBase):
    """Sets ``interlock_decision_info`` once; records nothing per step."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        from vllm.platforms import current_platform

        platform = "rocm" if current_platform.is_rocm() else str(current_platform.device_type)
        if not _GAUGE:
            _GAUGE.append(Gauge(METRIC, "The decision interlock's policy made for this engine "
                                "(runner, graph and compile mode, the rules, the policy revision)",
                                labelnames=LABELS, multiprocess_mode="mostrecent"))
        _GAUGE[0].labels(**labels_of(platform)).set(1)

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        return None

    def log_engine_initialized(self) -> None:
        return None
