"""Sparse streams: a statistic formed over enough instances whatever the collective's rate.

A stream whose window holds fewer than ``min_instances`` instances (one data-parallel
all-reduce per 5-10 s training step: one instance in one window of five) pools its windows
until it has that many: the sample is the instance-weighted mean of the windows' log-latency,
given to the CUSUMs in the window that completes it. A stream with enough instances per window
never pools (its samples are exactly as before); before this, such a stream never got a
baseline and the job was not monitored at all.

Its cadence is learned too: the interval between its windows with data (an EWMA), so that the
first value after a *gap* (a checkpoint pause) means a silence longer than 1.5x its usual
interval, not 1.5 windows, which every value of a sparse stream would be. A stream with enough
instances per window is judged against its job's cadence (`JobCadence`): every window for a
dense job, the step for a job whose collectives all come once per 2-10 s step.
"""
from __future__ import annotations

import numpy as np

__all__ = ["InstancePool", "JobCadence"]

_EWMA = 0.1


class InstancePool:
    """Per-stream pooled (sum of instances x log-latency, instances) and data interval."""

    def __init__(self, capacity: int):
        self.s = np.zeros(capacity)
        self.n = np.zeros(capacity, np.int64)
        self.interval = np.full(capacity, np.nan)   # EWMA of seconds between windows with data
        self.ranks = np.zeros(capacity, np.uint64)  # ranks (bit r % 64) with records in the pool's windows
        self.n_pooled = 0                           # samples formed by pooling

    def grow(self, extra: int) -> None:
        self.s = np.concatenate([self.s, np.zeros(extra)])
        self.n = np.concatenate([self.n, np.zeros(extra, np.int64)])
        self.interval = np.concatenate([self.interval, np.full(extra, np.nan)])
        self.ranks = np.concatenate([self.ranks, np.zeros(extra, np.uint64)])

    def clear(self, idx) -> None:
        self.s[idx] = 0.0
        self.n[idx] = 0
        self.ranks[idx] = 0

    def ranks_reporting(self, idx: np.ndarray, masks: np.ndarray, known: np.ndarray) -> np.ndarray:
        """Add the windows' rank sets ``masks`` to streams ``idx``'s pools; the number of ranks
        seen over each pool so far (-1 where the window's ranks are not ``known``). An instance
        straddling a window's edge puts some ranks' records in one window and the rest in the
        next: the pool's union, not the completing window, says whether a rank went away."""
        self.ranks[idx] |= masks
        return np.where(known, np.bitwise_count(self.ranks[idx]).astype(np.int64), -1)

    def forget(self, idx) -> None:
        self.clear(idx)
        self.interval[idx] = np.nan

    def add(self, idx: np.ndarray, log_lat: np.ndarray, inst: np.ndarray, need: int):
        """Pool the windows of streams ``idx``; returns (mask of the ones now complete, their
        pooled latency). Complete pools are emptied."""
        self.s[idx] += inst * log_lat
        self.n[idx] += inst
        done = self.n[idx] >= need
        j = idx[done]
        lat = np.exp(self.s[j] / self.n[j])
        self.clear(j)
        self.n_pooled += int(j.size)
        return done, lat

    def gap(self, idx: np.ndarray, dt: np.ndarray, window_s: float, sparse: np.ndarray,
            job_usual: np.ndarray) -> np.ndarray:
        """Which of ``idx`` (seconds ``dt`` since their last data, NaN: first) come back after a
        gap; learns their interval. Only ``sparse`` streams (fewer instances per window than a
        statistic needs) are judged against their interval; the others against 1.5 windows:
        an intermittent stream of a dense job (a mix's size bucket) must not stretch the gap
        that marks a checkpoint pause (the stationary suite's false changes otherwise), but
        against their job's cadence ``job_usual`` (seconds between the job's windows with data):
        in a job that reports once per 2.5 s step every value would otherwise follow a gap."""
        known = np.isfinite(self.interval[idx]) | ~sparse
        dense_usual = np.where(np.isfinite(job_usual), job_usual, window_s)
        usual = np.where(sparse & np.isfinite(self.interval[idx]), self.interval[idx], dense_usual)
        # a sparse stream's first interval is learnt, not judged (it is its step)
        out = known & np.isfinite(dt) & (dt > 1.5 * np.maximum(window_s, usual))
        learn = np.isfinite(dt) & ~out
        j = idx[learn]
        old = self.interval[j]
        self.interval[j] = np.where(np.isfinite(old), (1 - _EWMA) * old + _EWMA * dt[learn], dt[learn])
        return out


class JobCadence:
    """Per job: the EWMA of seconds between its windows with data (any stream), learnt from the
    intervals that were not a gap (longer than 1.5x the usual one: a pause is not a cadence)."""

    def __init__(self):
        self.last: dict[int, float] = {}
        self.interval: dict[int, float] = {}

    def observe(self, job_codes: np.ndarray, window_start: float, window_s: float) -> None:
        for j in np.unique(job_codes).tolist():
            prev = self.last.get(j)
            self.last[j] = window_start
            if prev is None:
                continue
            dt = window_start - prev
            old = self.interval.get(j)
            if old is None:
                self.interval[j] = max(dt, window_s)
            elif dt <= 1.5 * max(old, window_s):
                self.interval[j] = (1 - _EWMA) * old + _EWMA * max(dt, window_s)

    def paced(self, job_code: int, window_s: float) -> bool:
        """The job reports less often than every window (a step-paced job)."""
        return self.interval.get(job_code, 0.0) > 1.5 * window_s

    def usual(self, job_codes: np.ndarray) -> np.ndarray:
        return np.array([self.interval.get(j, np.nan) for j in job_codes.tolist()], np.float64)
