"""Prometheus metrics on their own port (Triton's ``--metrics-port``, 8002), at ``GET /metrics``.

Nothing here runs per request: a custom collector reads each model version's ``ModelStats`` (the
counters the statistics extension already keeps, updated once per batch on the event loop) when
Prometheus scrapes. The scrape runs on the event loop too, so it reads consistent counters
without a lock.

Metric names follow Triton (``nv_inference_*``, cumulative microseconds) and TorchServe
(``ts_*``), so dashboards written for either work unchanged. Triton's counters have no ``_total``
suffix, which prometheus_client always adds to a counter, so the ``nv_*`` families are written
here as Triton writes them (text format 0.0.4); everything else goes through prometheus_client.
``inferd_batch_size`` and ``inferd_request_duration_seconds`` are histograms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from inferd.core.model import Model
from inferd.core.server import InferenceServer
from inferd.core.stats import DURATION_BOUNDS_NS
from inferd.frontends.http import HttpRequest

LABELS = ["model", "version"]
#: Upper bounds of ``inferd_batch_size`` (rows per execution); +Inf follows.
BATCH_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128)
_DURATION_LE = [f"{ns / 1e9:g}" for ns in DURATION_BOUNDS_NS] + ["+Inf"]
_BATCH_LE = [str(b) for b in BATCH_SIZE_BOUNDS] + ["+Inf"]
_CONTENT_TYPE = CONTENT_TYPE_LATEST.encode()


def _cumulative(labels: list[str], counts: Iterable[int]) -> list[tuple[str, float]]:
    total = 0
    buckets = []
    for le, count in zip(labels, counts):
        total += count
        buckets.append((le, total))
    return buckets


def _batch_counts(batches: dict[int, list[int]]) -> list[int]:
    counts = [0] * (len(BATCH_SIZE_BOUNDS) + 1)
    for size, entry in batches.items():
        index = len(BATCH_SIZE_BOUNDS)
        for i, bound in enumerate(BATCH_SIZE_BOUNDS):
            if size <= bound:
                index = i
                break
        counts[index] += entry[0]
    return counts


class InferdCollector(Collector):
    """Reads every served model version's statistics at scrape time."""

    def __init__(self, core: InferenceServer) -> None:
        self.core = core

    def models(self) -> list[Model]:
        return [model for slot in list(self.core.models.values()) for model in list(slot.versions.values())]

    def collect(self) -> Iterator[Metric]:
        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=LABELS)

        ts_requests = counter("ts_inference_requests", "Total number of inference requests.")
        ts_latency = counter("ts_inference_latency_microseconds", "Cumulative inference duration in microseconds")
        ts_queue = counter("ts_queue_latency_microseconds", "Cumulative queue duration in microseconds")
        batch_size = HistogramMetricFamily("inferd_batch_size", "Rows per model execution (batch size)", labels=LABELS)
        duration = HistogramMetricFamily(
            "inferd_request_duration_seconds",
            "Duration of successful inference requests, from receipt to answer",
            labels=LABELS,
        )
        for model in self.models():
            stats = model.stats
            labels = [model.name, model.version_str]
            ts_requests.add_metric(labels, stats.success_count + stats.fail_count)
            ts_latency.add_metric(labels, (stats.success_ns + stats.fail_ns) // 1000)
            ts_queue.add_metric(labels, stats.queue_ns // 1000)
            batch_size.add_metric(
                labels, _cumulative(_BATCH_LE, _batch_counts(stats.batches)), sum_value=stats.inference_count
            )
            duration.add_metric(
                labels, _cumulative(_DURATION_LE, stats.duration_buckets), sum_value=stats.success_ns / 1e9
            )
        yield from (ts_requests, ts_latency, ts_queue, batch_size, duration)


#: Triton's families: (name, type, help, value of one model version)
TRITON_FAMILIES: tuple[tuple[str, str, str, Callable[[Model], int]], ...] = (
    (
        "nv_inference_request_success",
        "counter",
        "Number of successful inference requests, all batch sizes",
        lambda m: m.stats.success_count,
    ),
    (
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
        lambda m: m.stats.fail_count,
    ),
    (
        "nv_inference_count",
        "counter",
        "Number of inferences performed (does not include cached requests)",
        lambda m: m.stats.inference_count,
    ),
    ("nv_inference_exec_count", "counter", "Number of model executions performed", lambda m: m.stats.execution_count),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds",
        lambda m: m.stats.success_ns // 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative inference queuing duration in microseconds",
        lambda m: m.stats.queue_ns // 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds",
        lambda m: m.stats.input_ns // 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds",
        lambda m: m.stats.infer_ns // 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds",
        lambda m: m.stats.output_ns // 1000,
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
        lambda m: m.inflight,
    ),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_triton(models: list[Model]) -> bytes:
    """Triton's ``nv_*`` families in the Prometheus text format, with Triton's exact names."""
    lines: list[str] = []
    for name, kind, doc, value in TRITON_FAMILIES:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        for model in models:
            lines.append(f'{name}{{model="{_label(model.name)}",version="{model.version_str}"}} {value(model)}')
    return ("\n".join(lines) + "\n").encode()


class MetricsHttp:
    """The metrics port's HttpServer handler: ``GET /metrics``, 404 for anything else."""

    def __init__(self, core: InferenceServer) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = InferdCollector(core)
        self.registry.register(self.collector)

    def render(self) -> bytes:
        return render_triton(self.collector.models()) + generate_latest(self.registry)

    def __call__(self, request: HttpRequest) -> None:
        if request.path != "/metrics":
            request.respond_error(404, f"not found: {request.path} (metrics are at /metrics)")
            return
        if request.method != b"GET":
            request.respond_error(405, "use GET /metrics")
            return
        request.respond(200, self.render(), _CONTENT_TYPE)
