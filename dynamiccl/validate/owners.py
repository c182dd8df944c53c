"""Whose kernel a refused GPU time belongs to: a diagnostic for records the plugin flagged TIMING_SUSPECT.

NCCL hands the plugin a KernelCh event's GPU timestamps from a per-channel slot ring. When NCCL's host and
device counters of that ring disagree (2.28 after a send/recv to self; 2.31+ after a send/recv), the slot an
operation reads holds another kernel's timestamps, and the plugin refuses them (TIMING_SUSPECT, gpu_* kept as
seen). The owner of such a pair is the operation of the same process whose enqueue most recently precedes its
GPU start; the offset (in that process's collectives, by enqueue time) says how far the ring is out:
negative = an earlier kernel's timestamps (a stale slot), positive = a later one's (the stop waited for it).
"""
from __future__ import annotations

import numpy as np

from dynamiccl.collector.wire_format import EventFlags, Kind

__all__ = ["owner_offsets", "describe_offsets"]


def _process_offsets(mine: np.ndarray) -> np.ndarray:
    """Offsets of one process's flagged, GPU-stamped collectives (sorted by enqueue) to their owners."""
    enq = mine["enqueue_ns"].astype(np.int64)
    start = mine["gpu_start_ns"].astype(np.int64)
    idx = np.flatnonzero(((mine["flags"] & EventFlags.TIMING_SUSPECT) != 0) & (start > 0))
    owner = np.searchsorted(enq, start[idx], side="right") - 1
    return (owner - idx)[owner >= 0]


def owner_offsets(events: np.ndarray) -> dict:
    """Counts of flagged records whose timestamps belong to an earlier, the same or a later operation.

    >>> dt = [("pid", "u4"), ("kind", "u1"), ("flags", "u2"), ("enqueue_ns", "u8"), ("gpu_start_ns", "u8")]
    >>> ev = np.array([(1, 1, 0, 10, 11), (1, 1, 8, 20, 12), (1, 1, 8, 30, 41), (1, 1, 0, 40, 42)], dt)
    >>> owner_offsets(ev)
    {'flagged': 2, 'earlier': 1, 'same': 0, 'later': 1, 'median_offset': 0.0}
    """
    colls = events[events["kind"] == Kind.COLL]
    parts = [_process_offsets(np.sort(colls[colls["pid"] == pid], order="enqueue_ns"))
             for pid in np.unique(colls["pid"])]
    off = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return {"flagged": int(off.size), "earlier": int((off < 0).sum()), "same": int((off == 0).sum()),
            "later": int((off > 0).sum()), "median_offset": float(np.median(off)) if off.size else float("nan")}


def describe_offsets(o: dict) -> str:
    """One clause for a check's text; empty when no flagged record carried timestamps."""
    if not o["flagged"]:
        return ""
    return (f"; the refused timestamps of {o['flagged']} records belong to an earlier operation in "
            f"{o['earlier']}, to a later one in {o['later']} (median offset {o['median_offset']:+.0f} "
            "operations)")
