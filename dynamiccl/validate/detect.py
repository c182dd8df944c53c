"""Check 6b: the product's window aggregation and detector, fed the slow-rank phase's real records.

Needs the services' libraries (polars, river): when they are missing the check is skipped with the
command that runs it later on the saved records (``dynamiccl validate-nccl --analyse DIR``).
"""
from __future__ import annotations

import numpy as np

from dynamiccl.collector.wire_format import TimingSource
from dynamiccl.loop import Loop

from .checks import Check

__all__ = ["check_detection", "WINDOW_S", "WARMUP_WINDOWS"]

WINDOW_S = 0.5          # the test bed's window: the kit's phases are seconds long, not minutes
WARMUP_WINDOWS = 20     # 10 s of baseline before the slow rank starts at 15 s
MAX_DELAY_S = 5.0


def _run_detector(events: np.ndarray, hosts: dict[int, str]) -> tuple[list, str]:
    from dynamiccl.collector.component import FuncConsumer, RecordBatch
    from dynamiccl.collector.config import WindowConfig
    from dynamiccl.collector.processors.window_agg import WindowAggregator
    from dynamiccl.collector.records import event_time_ns, valid_mask
    from dynamiccl.detector.config import BaselineConfig, DetectorConfig
    from dynamiccl.detector.service import Detector

    det = Detector(DetectorConfig(baseline=BaselineConfig(warmup=WARMUP_WINDOWS)))
    changes: list = []
    loop = Loop(det, sinks=[changes.append])
    agg = WindowAggregator(WindowConfig(window_s=WINDOW_S, allowed_lateness_s=30.0),
                           next_consumer=FuncConsumer(lambda r: loop.step(r.features)))
    ev = events[valid_mask(events)]
    ev = ev[np.argsort(event_time_ns(ev), kind="stable")]
    for lo in range(0, len(ev), 4096):          # time-ordered slices, one batch per process each
        part = ev[lo:lo + 4096]
        for pid in np.unique(part["pid"]).tolist():
            agg.consume(RecordBatch(part[part["pid"] == pid], hosts.get(pid, f"pid{pid}"), "validate"))
    agg.shutdown()
    return changes, "dynamiccl.detector.service.Detector"


def gpu_clock_offset_ns(events: np.ndarray) -> float:
    """Median GPU start − enqueue of the GPU-timed records: maps the worker's wall-clock onset onto the records'
    event time (%globaltimer). Refused (TIMING_SUSPECT) or stale timestamps say nothing of the clock, and records
    without a GPU time use their enqueue time: 0 when no record is GPU-timed.

    >>> ev = np.array([(1, 10, 15), (0, 20, 900)], [("timing_source", "u1"), ("enqueue_ns", "u8"), ("gpu_start_ns", "u8")])
    >>> gpu_clock_offset_ns(ev), gpu_clock_offset_ns(ev[1:])
    (5.0, 0.0)
    """
    gpu = events["timing_source"] == TimingSource.KERNEL_GPU
    if not gpu.any():
        return 0.0
    return float(np.median(events["gpu_start_ns"][gpu].astype(np.int64) - events["enqueue_ns"][gpu].astype(np.int64)))


def check_detection(events: np.ndarray, hosts: dict[int, str], onset_ns: int, slow_rank: int) -> Check:
    """A regime change within ``MAX_DELAY_S`` of the slow rank's onset (event time), and where it points."""
    if not len(events) or not onset_ns:
        return Check("6b detection", False, "no records of the slow-rank phase")
    try:
        changes, name = _run_detector(events, hosts)
    except ImportError as e:
        return Check("6b detection", None, f"skipped: the detector needs {e.name} (pip install "
                     "'dynamiccl[services]'); run `dynamiccl validate-nccl --analyse DIR` where it is installed")
    offset = gpu_clock_offset_ns(events)
    onset_s = (onset_ns + offset) / 1e9
    hits = [c for c in changes if c.kind != "recovery" and -1.0 <= c.detected_s - onset_s <= MAX_DELAY_S]
    early = [c for c in changes if c.detected_s < onset_s - 1.0]
    rows = [f"{c.kind} detected {c.detected_s - onset_s:+.2f} s after the onset, onset est. "
            f"{c.start_s - onset_s:+.2f} s, magnitude {c.magnitude:.2f}, ranks {c.ranks[:4]}" for c in changes]
    first = hits[0] if hits else None
    named = bool(first and first.ranks and first.ranks[0] == slow_rank)
    ok = bool(hits) and not early
    summary = (f"{name}: {len(changes)} change(s); " + (
        f"{first.kind} {first.detected_s - onset_s:.2f} s after rank {slow_rank} slowed, "
        f"magnitude {first.magnitude:.2f}, first rank named {first.ranks[:1]} ({'right' if named else 'not the slow rank'})"
        if first else f"none within {MAX_DELAY_S} s of the onset") + (f"; {len(early)} before it" if early else ""))
    return Check("6b detection", ok, summary, {"changes": len(changes), "false_before_onset": len(early),
                                               "delay_s": round(first.detected_s - onset_s, 3) if first else None,
                                               "kind": first.kind if first else None, "slow_rank_named": named,
                                               "gpu_clock_offset_ms": round(offset / 1e6, 3)}, rows[:10])
