"""Prometheus metrics, defined once per process (module import), served at /metrics."""

from __future__ import annotations

import functools

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

http_requests = Counter(
    "parley_http_requests_total",
    "HTTP requests answered",
    ["method", "route", "status"],
    registry=REGISTRY,
)
http_latency = Histogram(
    "parley_http_request_duration_seconds",
    "Time to answer an HTTP request (streams: until the stream closes)",
    ["method", "route"],
    registry=REGISTRY,
)
runs_total = Counter(
    "parley_runs_total",
    "Runs that ended, by kind and status",
    ["kind", "status"],
    registry=REGISTRY,
)
turn_claims = Counter(
    "parley_turn_claims_total",
    "Plain turns claimed in one statement, by outcome (stored, or guard_failed: the turn "
    "went the careful way) and whether the model request was sent meanwhile (a failed "
    "guard then closed it: a request the provider may bill for nothing)",
    ["outcome", "overlapped"],
    registry=REGISTRY,
)
runs_active = Gauge("parley_runs_active", "Runs executing in this process", registry=REGISTRY)
run_takeovers = Counter(
    "parley_run_takeovers_total",
    "Runs this process resumed after the process running them stopped, by why "
    "(handover: released at shutdown; expired: its lease ran out)",
    ["reason"],
    registry=REGISTRY,
)
model_calls = Counter(
    "parley_model_calls_total", "Model API calls, by outcome", ["outcome"], registry=REGISTRY
)
model_tokens = Counter(
    "parley_model_tokens_total",
    "Tokens reported by the model API",
    ["kind"],
    registry=REGISTRY,
)
tool_calls = Counter(
    "parley_tool_calls_total", "Tool calls executed", ["tool", "is_error"], registry=REGISTRY
)
compactions = Counter(
    "parley_compactions_total",
    "Compactions, by trigger and outcome",
    ["trigger", "outcome"],
    registry=REGISTRY,
)
webhook_deliveries = Counter(
    "parley_webhook_deliveries_total",
    "Webhook delivery attempts, by event and outcome (delivered, retry, failed)",
    ["event", "outcome"],
    registry=REGISTRY,
)
throttled = Counter(
    "parley_throttled_requests_total",
    "Requests refused with 429 rate_limited, by limit (requests, turns, running_runs)",
    ["limit"],
    registry=REGISTRY,
)
budget_refusals = Counter(
    "parley_budget_refusals_total",
    "Posts refused and runs stopped for an exhausted token budget, by scope and where",
    ["scope", "stage"],
    registry=REGISTRY,
)
sse_streams = Gauge("parley_sse_streams_open", "SSE streams open", registry=REGISTRY)

__all__ = ["CONTENT_TYPE", "REGISTRY", "render"]


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    requests, latency = _request_series(method, route, status)
    requests.inc()
    latency.observe(seconds)


@functools.cache  # as many entries as the metrics have series
def _request_series(method: str, route: str, status: int) -> tuple[Counter, Histogram]:
    """The series of one kind of request, looked up once: `labels` takes a lock and
    builds its key on every call."""
    return http_requests.labels(method, route, str(status)), http_latency.labels(method, route)


def render() -> bytes:
    return generate_latest(REGISTRY)
