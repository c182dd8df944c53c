"""Prometheus text format 0.0.4 for the collector's own families, byte for byte what
``prometheus_client.generate_latest`` writes for the same families, at a fraction of its cost.

``generate_latest`` validates and escapes every label name of every sample; a histogram label set
is 24 samples, so a 4 MB ``/metrics`` took over a second of CPU, longer than a scrape may take
while an attack keeps the ingest threads busy. Here each label set is escaped once and its
samples reuse the string. A family is a :class:`Part`: its :class:`~dynamiccl.collector.metrics.MetricSpec`
and its rows; :func:`to_family` gives the prometheus_client object for the same part (in-process
readers of the registry), so both outputs come from one list of parts. A :class:`Renderer` also keeps
each label set's text from its previous render (only the label sets still present, so the cache is
bounded by what is exported) and formats integer values through a small memo.

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

__all__ = ["Part", "Renderer", "render", "to_family", "LE"]

#: the histogram's ``le`` label values, as prometheus_client writes them
LE = [repr(float(b)) for b in DURATION_BUCKETS_S] + ["+Inf"]
_INT_MEMO_MAX = 1 << 16
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


class Renderer:
    """Renders parts; label text and integer values are reused from one render to the next."""

    def __init__(self):
        self._labels: dict[str, dict] = {}   # family → {labels: text}, the last render's label sets only
        self._ints: dict[int, str] = {}

    def render(self, parts: Iterable[Part]) -> bytes:
        """The text of ``parts`` (what ``generate_latest`` writes for :func:`to_family` of each)."""
        out: list[str] = []
        for p in parts:
            out.append(_header(p.spec))
            (self._histogram if p.spec.type == "histogram" else self._simple)(p.spec, p.rows, out)
        return "".join(out).encode()

    def _num(self, v) -> str:
        if type(v) is not int:
            return floatToGoString(v)
        s = self._ints.get(v)
        if s is None:
            s = floatToGoString(v)
            if len(self._ints) < _INT_MEMO_MAX:
                self._ints[v] = s
        return s

    def _texts(self, spec: MetricSpec, rows, make) -> list:
        """``make(labels)`` for each row, reusing the previous render's text for the same labels."""
        prev = self._labels.get(spec.name, {})
        cur = {}
        for row in rows:
            k = row[0]
            cur[k] = prev.get(k) or make(k)
        self._labels[spec.name] = cur
        return [cur[row[0]] for row in rows]

    def _simple(self, spec: MetricSpec, rows, out: list[str]) -> None:
        name, names = spec.name, spec.labels
        order = sorted(range(len(names)), key=names.__getitem__)   # generate_latest sorts label names
        num = self._num
        heads = self._texts(spec, rows, lambda k: f"{name}{{{_labelstr(names, order, k)}}} " if names else f"{name} ")
        out.extend(f"{head}{num(value)}\n" for head, (_, value) in zip(heads, rows))

    def _histogram(self, spec: MetricSpec, rows, out: list[str]) -> None:
        name, names = spec.name, spec.labels
        order = sorted(range(len(names)), key=names.__getitem__)
        before = [i for i in order if names[i] < "le"]   # ``le`` takes its sorted place among the labels
        after = [i for i in order if names[i] > "le"]

        def make(k):
            head, tail = _labelstr(names, before, k), _labelstr(names, after, k)
            pre = f"{name}_bucket{{{head}," if head else f"{name}_bucket{{"
            post = f",{tail}}} " if tail else "} "
            ls = _labelstr(names, order, k)
            return [f'{pre}le="{le}"{post}' for le in LE], f"{name}_count{{{ls}}} ", f"{name}_sum{{{ls}}} "

        num = self._num
        for (buckets, count, total_head), (_, cum, total) in zip(self._texts(spec, rows, make), rows):
            out.extend(f"{b}{num(c)}\n" for b, c in zip(buckets, cum))
            out.append(f"{count}{num(cum[-1])}\n")
            out.append(f"{total_head}{num(total)}\n")


def render(parts: Iterable[Part]) -> bytes:
    """The text of ``parts``, without reuse across calls."""
    return Renderer().render(parts)


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
