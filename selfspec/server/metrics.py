"""Prometheus metrics of one server, in a registry of its own.

A registry per app (not prometheus_client's global one) lets tests and benchmarks run
several servers in one process. Request metrics are recorded by the HTTP handlers when a
request ends; the engine gauges (queue depth, slots in use) are set by the engine thread
after every iteration, so an aborted request's freed slots show up at once.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from selfspec.server.engine_loop import LoopStats

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    320.0,
    640.0,
)
_RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "selfspec_requests", "HTTP requests by endpoint and status code.", ["endpoint", "code"], registry=r
        )
        self.finished = Counter(
            "selfspec_requests_finished",
            "Completed generations by finish reason and mode.",
            ["finish_reason", "mode"],
            registry=r,
        )
        self.aborted = Counter(
            "selfspec_requests_aborted", "Requests cancelled before they finished, by reason.", ["reason"], registry=r
        )
        self.rejected = Counter(
            "selfspec_requests_rejected_queue_full", "Requests refused with 429 (queue full).", registry=r
        )
        self.body_disconnects = Counter(
            "selfspec_client_disconnects_during_body",
            "Clients that hung up before their request body arrived.",
            registry=r,
        )
        self.prompt_tokens = Counter("selfspec_prompt_tokens", "Prompt tokens of completed requests.", registry=r)
        self.generation_tokens = Counter(
            "selfspec_generation_tokens", "Generated tokens of completed requests.", registry=r
        )
        self.reasoning_tokens = Counter(
            "selfspec_reasoning_tokens", "Chain-of-thought tokens of completed requests.", registry=r
        )
        self.latency = Histogram(
            "selfspec_e2e_request_latency_seconds",
            "Request arrival to last token.",
            ["mode"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "selfspec_time_to_first_token_seconds",
            "Engine arrival to first output token.",
            ["mode"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tfat = Histogram(
            "selfspec_time_to_first_answer_token_seconds",
            "Engine arrival to first answer token (after thinking).",
            ["mode"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.proposed = Counter(
            "selfspec_spec_proposed_tokens", "Speculated tokens proposed for verification.", ["mode"], registry=r
        )
        self.accepted = Counter(
            "selfspec_spec_accepted_tokens", "Speculated tokens accepted by verification.", ["mode"], registry=r
        )
        self.ssr_accepted_prefix = Counter(
            "selfspec_ssr_accepted_prefix_tokens",
            "Draft answer tokens accepted by SSR prefix verification.",
            registry=r,
        )
        self.ssr_suffix_accepted = Counter(
            "selfspec_ssr_suffix_accepted_tokens", "Tokens accepted from draft-backed suffix decoding.", registry=r
        )
        self.ssr_drafts = Counter("selfspec_ssr_drafts", "SSR drafts forked.", registry=r)
        self.acceptance = Histogram(
            "selfspec_spec_acceptance_ratio",
            "Per request: accepted / proposed speculative tokens (requests that proposed any).",
            ["mode"],
            buckets=_RATIO_BUCKETS,
            registry=r,
        )
        self.waiting = Gauge("selfspec_queue_depth", "Requests waiting for a slot.", registry=r)
        self.running = Gauge(
            "selfspec_sequences_running", "Sequences holding a slot (SSR drafts included).", registry=r
        )
        self.slots_in_use = Gauge("selfspec_slots_in_use", "KV-cache slots in use.", registry=r)
        self.slots_total = Gauge("selfspec_slots_total", "KV-cache slots.", registry=r)
        self.in_flight = Gauge("selfspec_requests_in_flight", "Requests accepted and not finished.", registry=r)
        self.engine_steps = Gauge("selfspec_engine_steps", "Engine steps run since start.", registry=r)
        info = Gauge("selfspec_model_info", "The served model.", ["model"], registry=r)
        info.labels(model=model_name).set(1)

    # ------------------------------------------------------------------ recording
    def on_stats(self, stats: LoopStats) -> None:
        self.waiting.set(stats.waiting)
        self.running.set(stats.running)
        self.slots_in_use.set(stats.slots_in_use)
        self.slots_total.set(stats.slots_total)
        self.in_flight.set(stats.in_flight)
        self.engine_steps.set(stats.steps)

    def on_aborted(self, reason: str) -> None:
        self.aborted.labels(reason=reason).inc()

    def on_finished(self, *, mode: str, finish_reason: str, usage: dict[str, Any], latency_s: float) -> None:
        extra = usage["selfspec"]
        self.finished.labels(finish_reason=finish_reason, mode=mode).inc()
        self.prompt_tokens.inc(usage["prompt_tokens"])
        self.generation_tokens.inc(usage["completion_tokens"])
        self.reasoning_tokens.inc(extra["cot_tokens"])
        self.latency.labels(mode=mode).observe(latency_s)
        if extra["ttft_s"] is not None:
            self.ttft.labels(mode=mode).observe(extra["ttft_s"])
        if extra["first_answer_token_s"] is not None:
            self.tfat.labels(mode=mode).observe(extra["first_answer_token_s"])
        proposed, accepted = extra["proposed_tokens"], extra["accepted_tokens"]
        self.proposed.labels(mode=mode).inc(proposed)
        self.accepted.labels(mode=mode).inc(accepted)
        if proposed:
            self.acceptance.labels(mode=mode).observe(accepted / proposed)
        self.ssr_accepted_prefix.inc(extra["accepted_prefix"])
        self.ssr_suffix_accepted.inc(extra["suffix_accepted_tokens"])
        self.ssr_drafts.inc(extra["drafts"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
