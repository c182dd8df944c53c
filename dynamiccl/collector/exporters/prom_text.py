"""Prometheus text format 0.0.4 for the collector's own families, byte for byte what
``prometheus_client.generate_latest`` writes for the same families, at a fraction of its cost.

``generate_latest`` validates and escapes every label name of every sample; a histogram label set
is 24 samples, so a 4 MB ``/metrics`` took over a second of CPU, longer than a scrape may take
while an attack keeps the ingest threads busy. Here each label set is escaped once and its
samples reuse the string. A family is a :class:`Part`: its :class:`~dynamiccl.collector.metrics.MetricSpec`
and its rows; :func:`to_family` gives the prometheus_client object for the same part (in-process
readers of the registry), so both outputs come from one list of parts.

>>> from dynamiccl.collector.metrics import BY_NAME
>>> part = Part(BY_NAME["dynamiccl_collector_records_dropped_total"], [(("late",), 3)])
>>> print(render([part]).decode(), end="")
# HELP dynamiccl_collector_records_dropped_total Records dropped after receipt, by reason.
# TYPE dynamiccl_collector_records_dropped_total counter
dynamiccl_collector_records_dropped_total{reason="late"} 3.0
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from dynamiccl.collector.metrics import DURATION_BUCKETS_S, MetricSpec

__all__ = ["Part", "render", "to_family", "LE"]

#: the histogram's ``le`` label values, as prometheus_client writes them
LE = [repr(float(b)) for b in DURATION_BUCKETS_S] + ["+Inf"]
_FAMILY = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}


@dataclass
class Part:
    """One family: ``rows`` are ``(labels, value)``, for a histogram ``(labels, cumulative counts, sum)``
    with one count per :data:`LE`; labels are in the order of ``spec.labels``."""
    spec: MetricSpec
    rows: list


def _escape(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _labelstr(names: tuple[str, ...], order: list[int], values) -> str:
    return ",".join(f'{names[i]}="{_escape(str(values[i]))}"' for i in order)


def _header(spec: MetricSpec) -> str:
    doc = spec.help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {spec.name} {doc}\n# TYPE {spec.name} {spec.type}\n"


def _simple(spec: MetricSpec, rows, out: list[str]) -> None:
    name, names = spec.name, spec.labels
    order = sorted(range(len(names)), key=names.__getitem__)   # generate_latest sorts label names
    for labels, value in rows:
        ls = _labelstr(names, order, labels)
        out.append(f"{name}{{{ls}}} {floatToGoString(value)}\n" if ls else f"{name} {floatToGoString(value)}\n")


def _histogram(spec: MetricSpec, rows, out: list[str]) -> None:
    name, names = spec.name, spec.labels
    order = sorted(range(len(names)), key=names.__getitem__)
    before = [i for i in order if names[i] < "le"]   # ``le`` takes its sorted place among the labels
    after = [i for i in order if names[i] > "le"]
    for labels, cum, total in rows:
        head = _labelstr(names, before, labels)
        tail = _labelstr(names, after, labels)
        pre = f"{name}_bucket{{{head}," if head else f"{name}_bucket{{"
        post = f",{tail}}} " if tail else "} "
        out.extend(f'{pre}le="{le}"{post}{floatToGoString(c)}\n' for le, c in zip(LE, cum))
        ls = _labelstr(names, order, labels)
        out.append(f"{name}_count{{{ls}}} {floatToGoString(cum[-1])}\n")
        out.append(f"{name}_sum{{{ls}}} {floatToGoString(total)}\n")


def render(parts: Iterable[Part]) -> bytes:
    """The text of ``parts`` (what ``generate_latest`` writes for :func:`to_family` of each)."""
    out: list[str] = []
    for p in parts:
        out.append(_header(p.spec))
        (_histogram if p.spec.type == "histogram" else _simple)(p.spec, p.rows, out)
    return "".join(out).encode()


def to_family(part: Part):
    """The prometheus_client family of ``part``."""
    spec = part.spec
    f = _FAMILY[spec.type](spec.name, spec.help, labels=list(spec.labels))
    if spec.type == "histogram":
        for labels, cum, total in part.rows:
            f.add_metric([str(v) for v in labels], list(zip(LE, cum)), sum_value=total)
    else:
        for labels, value in part.rows:
            f.add_metric([str(v) for v in labels], value)
    return f
