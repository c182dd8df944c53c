"""SIGTERM ends the collector within 5 s even when its parquet writer is wedged."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


@pytest.mark.slow
def test_sigterm_ends_the_collector_within_5s_with_a_wedged_writer():
    d = tempfile.mkdtemp(prefix="dccl")
    proc = subprocess.Popen([sys.executable, "-m", "dynamiccl", "collector", "--listen", f"unix:{d}/c.sock",
                             "--metrics", "off", "--features", "off", "--parquet", f"{d}/pq",
                             "--gpu-telemetry", "off"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = None
    try:
        assert "collector ready" in proc.stdout.readline()
        writer = _children(proc.pid)[0]
        os.kill(writer, signal.SIGSTOP)        # a writer that no longer makes progress
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - t0
        assert took < 5.0, f"collector took {took:.1f} s to stop"  # before: ~30 s (writer_timeout_s)
    finally:
        if writer is not None:
            try:
                os.kill(writer, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()


def test_windows_still_open_at_the_shutdown_deadline_are_counted_not_aggregated():
    """Issue 18 #2: records spread over many windows (hour-spanning or forged event times) made closing
    them at SIGTERM take seconds; past the deadline the rest is counted as dropped ("shutdown")."""
    from dynamiccl.collector.component import RecordBatch
    from dynamiccl.collector.config import WindowConfig
    from dynamiccl.collector.metrics import SelfMetrics
    from dynamiccl.collector.processors.window_agg import WindowAggregator
    from dynamiccl.harness.collector_testing import synthetic_events

    class Clock:
        t = 100.0

        def __call__(self):
            return self.t

    class SlowExporter:   # every window takes a second to export
        def consume(self, result):
            clock.t += 1.0

    clock, m = Clock(), SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=1.0), next_consumer=SlowExporter(), metrics=m, clock=clock)
    t0 = 1_700_000_000 * 10**9
    ahead = synthetic_events(200, nranks=2, start_ns=t0, rate_per_s=20.0)   # 10 s of windows
    slow = synthetic_events(4, nranks=2, start_ns=t0)                        # holds the watermark at t0
    agg.consume(RecordBatch(slow, "h-slow", "j", {}))
    agg.consume(RecordBatch(ahead, "h-ahead", "j", {}))
    assert m.windows_emitted == 0
    agg.shutdown(deadline=clock.t + 3.5)
    assert m.windows_emitted == 4 and m.dropped["shutdown"] > 0
    assert m.aggregated + m.dropped["shutdown"] == len(ahead) + len(slow)   # every record accounted for
    agg.shutdown(deadline=clock.t)                                          # nothing left open
    assert m.aggregated + m.dropped["shutdown"] == len(ahead) + len(slow)


def test_a_queue_backlog_past_the_shutdown_deadline_is_counted_not_delivered():
    """A flood of small batches (100 k forged connections) left a backlog that shutdown delivered one by
    one on the caller's thread, past any bound; after the deadline the rest goes to ``on_late``."""
    import threading

    from dynamiccl.collector.component import QueuedConsumer

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    started, got, late = threading.Event(), [], []

    class Blocked:   # holds the first item 1 s: shutdown is requested meanwhile
        def consume(self, item):
            started.set()
            time.sleep(1.0 if not got else 0)
            got.append(item)

    clock = Clock()
    q = QueuedConsumer(Blocked(), max_items=1000, name="t", weight=len, clock=clock)
    q.start()
    for i in range(10):
        q.consume([i] * 3)
    assert started.wait(5)
    clock.t = 10.0                  # the deadline has passed
    q.shutdown(deadline=5.0, on_late=late.append)
    assert len(got) == 1 and len(late) == 9       # the worker finishes the item it holds; before: 10 delivered
    assert q.pending == 0
