"""``GET /metrics``: the server's state in Prometheus text, under vLLM's metric names.

A metric that means what one of vLLM's means has its name (``vllm:num_requests_running``,
``vllm:time_to_first_token_seconds``, ...), its labels (``model_name`` and ``engine``, the
engine's index: ``0``, the one engine) and its histograms' buckets, so a dashboard built for
vLLM reads it as it is. interlock's own series have an ``interlock_`` prefix: the errors by
status and the decision the server runs (the info metric ``interlock_decision_info``). The
registry is the server's own, not the process-global one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from interlock.app.decided_by import LOGGED_FIELDS
from interlock.runners.batching.request import Request
from interlock.runners.batching.step_loop import StepLoop

if TYPE_CHECKING:
    from interlock.policy.resolution import Resolution

#: Seconds: vLLM's default buckets of the same series (its v1 metrics), so that a
#: dashboard's quantiles over them mean the same thing.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
#: The ``engine`` label: vLLM numbers its engine cores; this server has one.
ENGINE = "0"


def decision_labels(resolution: Resolution) -> dict[str, str]:
    """The info metric's labels: the decided fields, and ``rule``: who chose each field the
    run acts on (``runner=rocm-dsa-stays-on-mrv1,cudagraph=defaults,...``)."""
    decision = resolution.decision
    rule = ",".join(
        f"{name}={resolution.provenance[name].source}" for name in LOGGED_FIELDS
    )
    return {
        "runner": decision.runner,
        "cudagraph_mode": decision.cudagraph,
        "breakable": str(decision.breakable).lower(),
        "compile": str(decision.compile).lower(),
        "rule": rule,
        "policy_version": str(resolution.policy.version),
        "policy_revision": resolution.policy.revision,
    }


class ServerMetrics:
    """The server's counters, gauges and histograms; the engine loop feeds them from its
    thread (``prometheus_client`` metrics are thread-safe)."""

    def __init__(self, model_name: str, decision: dict[str, str], num_blocks: int) -> None:
        self.registry = CollectorRegistry()
        self.num_blocks = num_blocks
        r, labels = self.registry, ["model_name", "engine"]
        name = {"model_name": model_name, "engine": ENGINE}
        self.running = Gauge("vllm:num_requests_running",
                             "Requests in the engine's running batch.", labels,
                             registry=r).labels(**name)
        self.waiting = Gauge("vllm:num_requests_waiting",
                             "Requests admitted and waiting for a slot in the batch.", labels,
                             registry=r).labels(**name)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc",
                              "Share of the KV-cache blocks in use (1 = all).", labels,
                              registry=r).labels(**name)
        self.prompt_tokens = Counter("vllm:prompt_tokens",
                                     "Prompt tokens of the requests that reached their first "
                                     "token.", labels, registry=r).labels(**name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.",
                                         labels, registry=r).labels(**name)
        self._success = Counter("vllm:request_success",
                                "Requests that finished, by finish reason (stop, length, "
                                "abort).", [*labels, "finished_reason"], registry=r)
        self._errors = Counter("interlock_request_errors",
                               "Requests answered with an error status, by status.",
                               [*labels, "status"], registry=r)
        self._shed = Counter("interlock_connections_shed",
                             "Connections closed by a bound: --max-connections, or no "
                             "request within --receive-timeout.", ["model_name"],
                             registry=r).labels(model_name=model_name)
        self.preemptions = Counter("vllm:num_preemptions",
                                   "Requests preempted to free KV-cache blocks.", labels,
                                   registry=r).labels(**name)
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Arrival to first token, per request.", labels,
                              buckets=TTFT_BUCKETS, registry=r).labels(**name)
        # vLLM's name for this gap since its v1 metrics; its
        # request_time_per_output_token_seconds is a per-request average, not this.
        self.tpot = Histogram("vllm:inter_token_latency_seconds",
                              "Gap between a request's consecutive tokens after the first.",
                              labels, buckets=TPOT_BUCKETS, registry=r).labels(**name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Arrival to finish, per request.", labels, buckets=E2E_BUCKETS,
                             registry=r).labels(**name)
        Info("interlock_decision", "The policy's decision this server runs.", ["model_name"],
             registry=r).labels(model_name=model_name).info(decision)
        self._name = model_name
        self._last_token: dict[Request, float] = {}

    def tokens(self, request: Request, before: int, now: float) -> None:
        count = len(request.output_token_ids)
        self.generation_tokens.inc(count - before)
        if before == 0 and request.first_token_time is not None:
            self.prompt_tokens.inc(len(request.prompt_token_ids))
            self.ttft.observe(request.first_token_time - request.arrival_time)
        elif request in self._last_token:
            # A step gives a running request one token: the gap is its time per token.
            gap = (now - self._last_token[request]) / (count - before)
            for _ in range(count - before):
                self.tpot.observe(gap)
        self._last_token[request] = now

    def finished(self, request: Request) -> None:
        self._last_token.pop(request, None)
        reason = request.finish_reason.value if request.finish_reason is not None else "abort"
        self._success.labels(model_name=self._name, engine=ENGINE,
                             finished_reason="abort" if reason == "aborted" else reason).inc()
        if request.finish_time is not None:
            self.e2e.observe(request.finish_time - request.arrival_time)
        self.preemptions.inc(request.num_preemptions)

    def stepped(self, step_loop: StepLoop) -> None:
        scheduler = step_loop.scheduler
        self.running.set(len(scheduler.running))
        self.waiting.set(len(scheduler.waiting))
        free = scheduler.allocator.num_free
        self.kv_usage.set(1 - free / self.num_blocks if self.num_blocks else 0.0)

    def shed(self) -> None:
        self._shed.inc()

    def error(self, status: int) -> None:
        self._errors.labels(model_name=self._name, engine=ENGINE, status=str(status)).inc()
