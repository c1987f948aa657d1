"""OpenTelemetry's SDK with in-memory exporters, installed once per test process.

OpenTelemetry allows one global tracer and meter provider per process; every test reads
what it needs by its producer's or consumer's ``msgsafe.target`` attribute (a unique
URL per test), so tests sharing the exporters do not see each other's figures.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

try:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
except ImportError:  # pragma: no cover - the message says how to get it
    pytest.fail(
        "the telemetry tests need the OpenTelemetry SDK: pip install -e '.[all,dev]' "
        "(or bash scripts/bootstrap.sh all)",
        pytrace=False,
    )

__all__ = ["SpanProcessor", "install", "metric_points", "metric_total", "spans_of", "trace"]

_LOCK = threading.Lock()
_INSTALLED: tuple[InMemorySpanExporter, InMemoryMetricReader] | None = None


def install() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """The process's span exporter and metric reader (installed on first use)."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED is None:
            spans = InMemorySpanExporter()
            tracer_provider = TracerProvider()
            tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
            trace.set_tracer_provider(tracer_provider)
            reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            _INSTALLED = (spans, reader)
        return _INSTALLED


def spans_of(target: str) -> list[ReadableSpan]:
    """Finished spans whose ``msgsafe.target`` is ``target``."""
    exporter, _ = install()
    return [
        span
        for span in exporter.get_finished_spans()
        if (span.attributes or {}).get("msgsafe.target") == target
    ]


def metric_points(target: str) -> dict[str, list[tuple[Mapping[str, Any], float]]]:
    """Every data point of ``target``'s metrics: name -> [(attributes, value)] (a
    histogram's value is its count)."""
    _, reader = install()
    found: dict[str, list[tuple[Mapping[str, Any], float]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attrs = dict(point.attributes or {})
                    if attrs.get("msgsafe.target") != target:
                        continue
                    value = getattr(point, "value", None)
                    if value is None:
                        value = point.count  # type: ignore[union-attr]
                    found.setdefault(metric.name, []).append((attrs, float(value)))
    return found


def metric_total(target: str, name: str, **match: str) -> float:
    """The sum of ``name``'s points for ``target`` whose attributes include ``match``."""
    return sum(
        value
        for attrs, value in metric_points(target).get(name, [])
        if all(attrs.get(k) == v for k, v in match.items())
    )
