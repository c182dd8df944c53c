"""The step-rate stream: per (job, communicator), the seconds per collective instance of a window.

A throttle that lengthens a training step shows in the job's rate of collectives even when
each collective's latency does not move: 4-64 KiB gradient buckets whose per-window p50 varies
3-200x between neighbouring windows hide a 2x slower step, while the communicator's instances
per window fall from ~36 to ~16. So each communicator also gets one synthetic ``keys`` row per
window, ``func`` = ``STEP_FUNC``, whose "latency" is ``window_s / instances`` (all its
collectives together): it goes through the same baselines, charts and fusion as every stream,
and a longer period is a degradation like a longer latency.

A pause is not a change. The first window after a gap (a checkpoint pause, a job's start) is
only partly covered by the job, so a window's rate counts only when the window before it had
data from the same communicator. The window a pause starts in is partial too, but nothing can
tell that until the next window; it is one low value followed by silence, which the fusion's
confirmation drops (`tests/detector/test_step_rate.py`). Emitting each window's rate one
window late, once the next window had data, was measured too: on the test bed's dev half it
reported one change fewer within 5 s (76 vs 77 of 139) for one false alarm more (20 vs 19).
A job that reports less often than every window (one step per 2-10 s) has no step-rate stream:
its cadence is `dynamiccl.detector.sparse`'s.

The noise of a count of n instances is about 1/sqrt(n) in log (arrivals at a window's edges),
so a step-rate stream's baseline scale is floored there (`floor`), not at the latency floor.
"""
from __future__ import annotations

import numpy as np
import polars as pl

__all__ = ["STEP_FUNC", "STEP_BUCKET", "StepRate", "floor"]

STEP_FUNC = "StepRate"      # the synthetic stream's collective name
STEP_BUCKET = -1            # ... and size bucket (no message size)
_ADJACENT = 0.5             # windows are contiguous when their starts differ by window_s +- half
_GROUP = ("job_id", "comm_hash")


def floor(instances_ref: np.ndarray, scale_floor: float) -> np.ndarray:
    """Baseline-scale floor of step-rate streams with ``instances_ref`` typical instances."""
    with np.errstate(divide="ignore", invalid="ignore"):
        f = 1.0 / np.sqrt(np.maximum(instances_ref, 1.0))
    return np.maximum(np.where(np.isfinite(f), f, 1.0), scale_floor)


class StepRate:
    """Turns each window's ``keys`` into its step-rate rows (see the module)."""

    def __init__(self):
        self._prev: pl.DataFrame | None = None   # previous window's totals, with their run lengths
        self._prev_start = float("nan")
        self.emitted = 0                         # rows emitted
        self.held_back = 0                       # rows not emitted (the first window of a run)

    def rows(self, keys: pl.DataFrame, window_start: float, window_s: float) -> pl.DataFrame | None:
        """The step-rate rows of the window at ``window_start`` (None: none): one per
        communicator with data in this window and the one before."""
        cur = _totals(keys)
        prev = self._prev
        adjacent = prev is not None and abs(window_start - self._prev_start - window_s) <= _ADJACENT * window_s
        if adjacent and cur.height:
            cur = (cur.join(prev.select(*_GROUP, pl.col("run").alias("prev_run")), on=_GROUP, how="left")
                   .with_columns((pl.col("prev_run").fill_null(0) + 1).alias("run")).drop("prev_run"))
        else:
            cur = cur.with_columns(pl.lit(1, dtype=pl.Int64).alias("run"))
        out = None
        run = cur.filter(pl.col("run") >= 2)
        self.held_back += cur.height - run.height
        if run.height:
            out = run.select(
                *_GROUP, "comm_name", "nranks", "nnodes", "records", "instances", "bytes_total",
                pl.lit(STEP_FUNC).alias("func"), pl.lit("").alias("algo"), pl.lit("").alias("proto"),
                pl.lit(STEP_BUCKET, dtype=pl.Int32).alias("size_bucket"),
                (window_s / pl.col("instances").cast(pl.Float64)).alias("lat_p50_s"))
            self.emitted += out.height
        self._prev, self._prev_start = cur, float(window_start)
        return out

    def with_rows(self, keys: pl.DataFrame, window_start: float, window_s: float) -> pl.DataFrame:
        """``keys`` with the step-rate rows appended (columns it lacks are null there)."""
        extra = self.rows(keys, window_start, window_s)
        if extra is None:
            return keys
        return pl.concat([keys, extra], how="diagonal_relaxed")


def _totals(keys: pl.DataFrame) -> pl.DataFrame:
    if keys.height == 0:
        return pl.DataFrame(schema={"job_id": pl.String, "comm_hash": pl.UInt64, "comm_name": pl.String,
                                    "nranks": pl.Int32, "nnodes": pl.Int32, "records": pl.Int64,
                                    "instances": pl.Int64, "bytes_total": pl.Int64})
    k = keys.filter(pl.col("func") != STEP_FUNC)
    if "nranks" not in k.columns:
        k = k.with_columns(pl.lit(None, dtype=pl.Int32).alias("nranks"))
    return (k.group_by(*_GROUP, maintain_order=True)
            .agg(pl.col("comm_name").first(), pl.col("nranks").max(), pl.col("nnodes").max(),
                 pl.col("records").sum(), pl.col("instances").sum(), pl.col("bytes_total").sum())
            .filter(pl.col("instances") > 0))
