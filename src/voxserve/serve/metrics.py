"""Prometheus metrics of one server (its own registry: several apps in one process stay apart)."""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (re-exported for the app)
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from ..engine import BatchObserver


class Metrics(BatchObserver):
    def __init__(self, engine=None):
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "voxserve_requests",
            "HTTP requests by route and status; status 499 (nginx's 'client closed request') counts requests "
            "whose client disconnected before the response was complete (an aborted upload or download), "
            "which are never counted as 500",
            ["route", "status"], registry=r)
        self.failed_after_first_bytes = Counter(
            "voxserve_failed_after_first_bytes",
            "Requests that failed after their response had started, by route and error code (audio_too_long, "
            "timeout, internal_error, ...): a raw stream is cut (no closing chunk), an SSE stream ends with an "
            "error event. voxserve_requests_total counts each under its error's status (413, 504, 500, ...)",
            ["route", "code"], registry=r)
        self.connections_dropped = Counter(
            "voxserve_connections_dropped",
            "Connections the server closed before a request reached the app: reason header_timeout (no "
            "complete request head in time) or too_many_connections (answered 503)",
            ["reason"], registry=r)
        self.in_flight = Gauge("voxserve_in_flight_requests", "Synthesis requests being served", registry=r)
        self.queue_depth = Gauge("voxserve_queue_depth_sentences", "Sentences waiting for a batch", registry=r)
        self.batch_size = Histogram("voxserve_batch_size", "Sentences per batch", registry=r,
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64))
        self.batch_phonemes = Histogram("voxserve_batch_phonemes", "Phoneme ids per batch", registry=r,
                                        buckets=(32, 64, 128, 256, 512, 1024, 2048, 4096, 8192))
        self.step_sequences = Histogram("voxserve_step_sequences",
                                        "Sequences active in a step of a step voice (continuous batching)",
                                        registry=r, buckets=(1, 2, 4, 8, 16, 32, 64))
        self.batch_seconds = Histogram("voxserve_batch_seconds", "Model time per batch", registry=r,
                                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10))
        self.ttfa = Histogram("voxserve_time_to_first_audio_seconds", "Request accepted -> first audio ready",
                              registry=r, buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30))
        self.rtf = Histogram("voxserve_real_time_factor", "Model seconds per audio second, per batch", registry=r,
                             buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2))
        self.sentences = Counter("voxserve_sentences_synthesized", "Sentences run through a model", registry=r)
        self.sentences_dropped = Gauge("voxserve_sentences_dropped",
                                       "Queued sentences dropped by cancellation (total)", registry=r)
        self.audio_seconds = Counter("voxserve_audio_seconds", "Seconds of audio synthesised", registry=r)
        self.device_memory = Gauge("voxserve_device_memory_bytes",
                                   "Memory in use: CUDA allocated bytes per device, or the process RSS on CPU",
                                   ["device"], registry=r)
        self.engine = engine

    # BatchObserver (called from the worker threads; prometheus_client is thread safe)
    def on_batch(self, voice: str, size: int, cost: int, seconds: float, audio_seconds: float, finished: int) -> None:
        self.batch_size.observe(size)
        self.batch_phonemes.observe(cost)
        self.batch_seconds.observe(seconds)
        self.sentences.inc(finished)
        self.audio_seconds.inc(audio_seconds)
        if audio_seconds > 0:
            self.rtf.observe(seconds / audio_seconds)

    def on_step(self, voice: str, active: int, finished: int, seconds: float, audio_seconds: float) -> None:
        self.step_sequences.observe(active)
        self.sentences.inc(finished)
        self.audio_seconds.inc(audio_seconds)

    def render(self) -> bytes:
        eng = self.engine
        if eng is not None:
            self.queue_depth.set(eng.queued_sentences())
            self.in_flight.set(eng.in_flight)
            self.sentences_dropped.set(eng.sentences_dropped)
            for dev, used in _memory(eng).items():
                self.device_memory.labels(dev).set(used)
        return generate_latest(self.registry)


def _memory(engine) -> dict[str, float]:
    out: dict[str, float] = {}
    devices = {str(v.device) for v in engine.voices.values()}
    for dev in devices:
        if dev.startswith("cuda"):
            try:
                import torch

                out[dev] = float(torch.cuda.memory_allocated(dev))
            except Exception:  # a metrics scrape must never fail the server
                continue
        else:
            try:
                with open("/proc/self/statm") as f:
                    out[dev] = float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
            except (OSError, ValueError, IndexError):
                continue
    return out
