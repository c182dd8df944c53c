"""/metrics text: the fast renderer writes what prometheus_client would, once per window (issue 18 #4)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import PrometheusConfig, WindowConfig
from dynamiccl.collector.exporters.prometheus import PrometheusExporter
from dynamiccl.collector.metrics import PluginStats, SelfMetrics
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.harness.collector_testing import synthetic_events

HOSTILE = 'j"ob\\x\nz'   # quote, backslash, newline: every character the text format escapes


class Clock:
    t = 1000.0

    def __call__(self):
        return self.t


def _exporter():
    clock, m, ps = Clock(), SelfMetrics(), PluginStats()
    exp = PrometheusExporter(PrometheusConfig(address=None, gauge_ttl_s=15.0), metrics=m, plugin_stats=ps,
                             registry=CollectorRegistry(), clock=clock)
    agg = WindowAggregator(WindowConfig(), next_consumer=exp, metrics=m, clock=clock)
    return clock, m, ps, exp, agg


def _window(agg, start_ns, jobs=("j0", HOSTILE)):
    for i, job in enumerate(jobs):
        ev = synthetic_events(40, nranks=2, seed=i, start_ns=start_ns, funcs=("AllReduce", "AllGather"),
                              log2_bytes=(10, 24))
        agg.consume(RecordBatch(ev, f"host-{i}", job, {0x1111_2222_3333_4444: "world"} if i else {}))
    agg.shutdown()


def _only(collector) -> bytes:
    reg = CollectorRegistry()
    reg.register(collector)
    return generate_latest(reg)


def test_fast_text_is_byte_for_byte_what_prometheus_client_writes():
    """Before: every scrape went through generate_latest (1.3 s of CPU for 4 MB); the fast text must be
    the same bytes, hostile label values included."""
    clock, m, ps, exp, agg = _exporter()
    m.gap(HOSTILE, "h", 3, 1)
    m.refused("auth")
    ps.update(HOSTILE, "h", ("h", 1, 0), {"records_sent": 5, "reconnects": 1})
    _window(agg, 1_700_000_000 * 10**9)
    text = exp.collector.render()
    assert b"dynamiccl_collective_duration_seconds_bucket" in text and b'j\\"ob\\\\x\\nz' in text
    assert text == _only(exp.collector)
    _window(agg, 1_700_000_001 * 10**9)             # same label sets, new values: reused label text
    assert exp.collector.render() == _only(exp.collector)
    clock.t += 20                                   # the gauges expire: both drop them alike
    assert exp.collector.render() == _only(exp.collector)


def test_served_body_has_each_family_once_and_the_other_collectors():
    clock, m, ps, exp, agg = _exporter()
    ProcessCollector(registry=exp.registry)
    _window(agg, 1_700_000_000 * 10**9)
    body = exp.body().decode()
    types = [ln.split()[2] for ln in body.splitlines() if ln.startswith("# TYPE")]
    assert len(types) == len(set(types))            # the collector's families are not rendered twice
    assert "process_cpu_seconds_total" in types and "dynamiccl_collectives_total" in types
    assert generate_latest(exp.registry).decode().count("# TYPE dynamiccl_collectives_total") == 1


def _count_builds(exp) -> list:
    """A list that grows by one each time the collective text is built."""
    calls = []
    build = exp.collector._collective_parts
    exp.collector._collective_parts = lambda: calls.append(1) or build()
    return calls


def test_collective_text_is_built_once_per_window():
    clock, m, ps, exp, agg = _exporter()
    calls = _count_builds(exp)
    _window(agg, 1_700_000_000 * 10**9)
    for _ in range(3):
        exp.collector.render()
    assert len(calls) == 1                          # scrapes between windows reuse the text
    m.received += 5
    assert b"dynamiccl_collector_records_received_total 5.0" in exp.collector.render()  # self-counters are live
    _window(agg, 1_700_000_001 * 10**9)
    exp.collector.render()
    assert len(calls) == 2
    clock.t += 20                                   # gauge expiry changes the text without a window
    exp.collector.render()
    assert len(calls) == 3


def test_while_scraped_each_window_renders_ahead_so_a_scrape_only_sends_bytes():
    clock, m, ps, exp, agg = _exporter()
    calls = _count_builds(exp)
    _window(agg, 1_700_000_000 * 10**9)
    assert calls == []                              # never scraped: nothing rendered ahead
    exp.collector.render()
    _window(agg, 1_700_000_001 * 10**9)
    assert len(calls) == 2                          # built by the window, not by the next scrape
    exp.collector.render()
    assert len(calls) == 2
    clock.t += 31                                   # no scrape for render_ahead_s: back to lazy
    _window(agg, 1_700_000_002 * 10**9)
    assert len(calls) == 2


def test_a_scrape_during_a_build_gets_the_previous_text_instead_of_building_again():
    """Before: a scrape arriving while the window thread rendered ahead built the same 4 MB text a second
    time on the same GIL (forged-label attack: 0.3-1.2 s to the response headers)."""
    clock, m, ps, exp, agg = _exporter()
    _window(agg, 1_700_000_000 * 10**9)
    exp.collector.render()
    old = exp.collector.collective_text()
    calls = _count_builds(exp)
    with exp.collector._building:                   # another thread is building
        _window(agg, 1_700_000_001 * 10**9)
        assert exp.collector.render().endswith(old) and calls == []
    assert not exp.collector.render().endswith(old) and len(calls) == 1
