"""The declared column schema of the stream table: one array per column, one slot per stream.

Allocation, growth and eviction all follow this table, so a new column is declared once
(name, dtype, fill value, whether an evicted slot is reset to its fill) instead of being
listed in three places that can drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Column", "COLUMNS", "alloc_columns", "grow_columns", "reset_columns"]

_FAR_PAST = -(1 << 40)


@dataclass(frozen=True)
class Column:
    name: str
    dtype: object
    fill: object
    evict: bool = False          # reset to ``fill`` when the slot is freed
    doc: str = ""


COLUMNS: tuple[Column, ...] = (
    Column("active", bool, False, doc="slot holds a live stream"),
    Column("comm_hash", np.uint64, 0),
    Column("size_bucket", np.int32, 0),
    Column("nnodes", np.int32, 0),
    Column("bytes_ref", np.float64, np.nan, True, "bytes per record of the current workload"),
    Column("bytes_per_record", np.float64, np.nan),
    Column("coverage_ref", np.float64, np.nan, True, "ranks reporting per instance, reference"),
    Column("coverage", np.float64, np.nan),
    # ranks of the stream's communicator reporting in the window (the ranks frame; -1: unknown)
    # and in the window its coverage reference was set: a coverage change is a rank vanishing
    # or joining only if that number changed
    Column("reporting", np.int64, -1),
    Column("reporting_ref", np.int64, -1, True),
    Column("rank_set_changed", bool, False),
    Column("lost_prev", bool, False, True, "the stream's last window with data showed a rank-set change"),
    Column("instances_ref", np.float64, np.nan, True, "EWMA of instances per window"),
    Column("instances", np.float64, 0.0),
    # log(p90 / p50) of the latest window and of the one before: a window holding a regime
    # change mixes both regimes, its p90 far ahead of its p50 (`Fusion`, `onset_wait`)
    Column("spread", np.float64, np.nan, True),
    Column("spread_prev", np.float64, np.nan, True),
    # the workload before the current one, and its baseline
    Column("prev_bpr", np.float64, np.nan, True),
    Column("prev_cov", np.float64, np.nan, True),
    Column("prev_med", np.float64, np.nan, True),
    Column("prev_scale", np.float64, np.nan, True),
    Column("prev_n", np.int64, 0, True),
    Column("rebase_warm", bool, False, True, "warming up after a workload change"),
    # the workload before the last change, and whether its baseline was unknown
    Column("old_bpr", np.float64, np.nan),
    Column("old_cov", np.float64, np.nan),
    Column("old_unknown", bool, False),
    # the baseline a stream had when it last alarmed (restored with its sample count)
    Column("saved_med", np.float64, np.nan, True),
    Column("saved_n", np.int64, 0),
    # the scale (and sample count) at the last alarm, pooled into the re-learnt baseline of the
    # new level (`dynamiccl.detector.self_start`); 0 after a workload change
    Column("carry_scale", np.float64, np.nan),
    Column("carry_n", np.int64, 0, True),
    Column("ap_ref", np.uint64, 0, True, "(algo, proto) bit set of the last window"),
    Column("last_seen", np.float64, -np.inf),
    Column("gap_step", np.int64, _FAR_PAST),
    Column("monitor_since", np.int64, _FAR_PAST, doc="step the current baseline was set"),
    Column("job", object, None),
    Column("job_code", np.int32, -1),
    Column("func", object, None),
    Column("is_step", bool, False, True, "a step-rate stream (`dynamiccl.detector.step_rate`)"),
    Column("comm_name", object, None),
)


def alloc_columns(obj, cap: int) -> None:
    for c in COLUMNS:
        setattr(obj, c.name, np.full(cap, c.fill, dtype=c.dtype))


def grow_columns(obj, extra: int) -> None:
    for c in COLUMNS:
        a = getattr(obj, c.name)
        setattr(obj, c.name, np.concatenate([a, np.full(extra, c.fill, dtype=c.dtype)]))


def reset_columns(obj, idx: np.ndarray) -> None:
    """Freed slots: every ``evict`` column back to its fill value."""
    for c in COLUMNS:
        if c.evict:
            getattr(obj, c.name)[idx] = c.fill
