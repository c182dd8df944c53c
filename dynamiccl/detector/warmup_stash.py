"""A warming stream's A -> B -> A workload: the A warm-up resumes (`StreamRebase._rebase_streams`).

A stream whose make-up changes (sizes per record, its ranks reporting per instance, its algo/proto
set) is re-baselined; a monitored stream keeps its fixed baseline with that workload, and when the
workload comes back the baseline is restored (no blind warm-up after a mix that ends). A stream
still in its warm-up had nothing kept: every change of make-up threw its warm-up samples away.

Rule: at a rebase, a stream in its first warm-up (no open early alarm: such a stream's later samples
are of the changed regime) with at least ``early_min`` warm-up samples stashes them with
their workload (bytes per record, coverage); a later rebase to a workload that matches the stash
within half the rebase tolerances (the test the restore of fixed baselines uses) resumes the warm-up
from those samples (the samples of the workload in between are dropped). One stash per stream,
the latest, so memory stays bounded (``warmup`` floats per stream that has one).

Why: on a step-paced test-bed job (dev seed 22, 2 ranks, one sample per 2-4 s) an instance
straddling a window's edge leaves one rank in two successive windows with data now and then, and
the rank-set test takes that for a rank that left: its bucket-19 stream was re-baselined 3 times in
12 s and sat at 1-4 warm-up samples (under ``early_min`` = 10, so no chart could alarm) when a
4.3x throttle came (never reported). The rule is the restore rule the monitored streams already
have, extended to warm-ups; no value is chosen.
"""
from __future__ import annotations

import numpy as np

__all__ = ["WarmupStash"]


class WarmupStash:
    """Per-stream stash: warm-up samples and their workload; counters."""

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self.saved: dict[int, tuple[np.ndarray, float, float]] = {}   # stream -> (samples, bpr, cov)
        self.n_stashed = 0
        self.n_resumed = 0

    def forget(self, idx) -> None:
        for i in np.atleast_1d(np.asarray(idx, np.int64)).tolist():
            self.saved.pop(i, None)

    def take(self, table, idx: np.ndarray, new_bpr: np.ndarray, new_cov: np.ndarray) -> tuple[dict, np.ndarray]:
        """Before streams ``idx`` are reset: their stashes that match the new workload (to resume
        after the reset), and stash the warm-ups being thrown away. Returns (resume: stream ->
        samples, stashed mask)."""
        if not self.enabled or idx.size == 0:
            return {}, np.zeros(idx.size, bool)
        cfg = table.config
        resume: dict[int, np.ndarray] = {}
        for i, b, c in zip(idx.tolist(), new_bpr.tolist(), new_cov.tolist()):
            s = self.saved.get(i)
            if s is None:
                continue
            if not table.early.first[i]:   # it got a fixed baseline since: that one is restored instead
                self.saved.pop(i, None)
                continue
            with np.errstate(invalid="ignore", divide="ignore"):
                ok = (abs(np.log(b / s[1])) <= 0.5 * cfg.workload.mix_change
                      and abs(np.log(c / s[2])) <= 0.5 * cfg.workload.coverage_change)
            if ok:
                resume[i] = s[0]
        rows, counts = table.banks[0].warm_samples(idx)
        # only a first warm-up with no open early alarm: a stream re-warming after an alarm, or
        # whose early alarm is open, is learning the changed regime (not its baseline)
        open_alarm = np.fromiter((i in table.early.saved for i in idx.tolist()), bool, idx.size)
        warming = (table.banks[0].warming_up[idx] & table.early.first[idx] & ~open_alarm
                   & (counts >= cfg.baseline.early_min))
        for n in np.flatnonzero(warming).tolist():
            i = int(idx[n])
            if i in resume:            # going back to the stash: keep it as it is
                continue
            self.saved[i] = (rows[n, : counts[n]].copy(), float(table.bytes_ref[i]), float(table.coverage_ref[i]))
            self.n_stashed += 1
        return resume, warming

    def resume(self, table, resume: dict) -> np.ndarray:
        """After the reset: streams of ``resume`` warm up again from their stashed samples."""
        if not resume:
            return np.zeros(0, np.int64)
        j = np.fromiter(resume, np.int64, len(resume))
        width = table.banks[0].warmup
        rows = np.full((j.size, width), np.nan)
        counts = np.zeros(j.size, np.int64)
        for n, i in enumerate(j.tolist()):
            s = resume[i][: width - 1]
            rows[n, : s.size], counts[n] = s, s.size
            self.saved.pop(i, None)
        for bank in table.banks:
            bank.resume_warmup(j, rows, counts)
        self.n_resumed += int(j.size)
        return j
