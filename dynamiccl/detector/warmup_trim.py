"""Rule: at a recovery, streams of the incident's communicators still in their warm-up forget
the samples they took since the incident's onset.

A stream's warm-up learns every window it sees. When a change is reported while some streams
of the same communicator are still warming up (the early chart fired on a few of them, the
others' spread hid it), those streams kept learning the degraded level; once their warm-up
completed, the baseline held both regimes (test-bed seed 30: 15 throttled windows at 5-8x in a
60-window warm-up, baseline scale 0.92 in log units, so every later 2x change moved the CUSUM
by ~0.1 of its threshold per window and nothing more was reported). The detector itself said
those windows were another regime, so they are not the baseline's: at the recovery the warm-up
goes on from its samples before the onset, as the early chart already does for the streams
that alarmed (`dynamiccl.detector.early`). Streams that completed their warm-up during the
incident are re-learnt by the recovery already (`Tracking._restore`).

Option ``baseline.trim_warmup``, off by default: on the test bed's dev half it reported one more
change within 5 s (seed 16 #8) for two more false alarms (seed 16); the simulated llama70b-fsdp
subset is unchanged (docs/evaluation/2026-11-28-detection-dense.md, Session 20, helper D3).
Counter: ``Fusion.counters["warmups_trimmed"]`` (streams trimmed).
"""
from __future__ import annotations

import numpy as np

__all__ = ["trim_warmups"]


def _samples_since(tab, idx: np.ndarray, onset_step: int) -> np.ndarray:
    """Values streams ``idx`` gave from ``onset_step`` to now: counted in the history, and every
    older window assumed to have given one (a dense stream does)."""
    H = tab.config.streams.history
    lo = max(onset_step, tab.t - H + 1)
    older = max(0, lo - onset_step)
    steps = np.arange(lo, tab.t + 1) % H
    seen = np.isfinite(tab.hist[steps][:, idx]).sum(axis=0) if steps.size else np.zeros(idx.size, np.int64)
    return older + seen


def trim_warmups(tab, inc) -> int:
    """Streams of ``inc``'s communicators and job, not its own, still in their warm-up (and not
    held by an open early alarm) drop their samples since ``inc.onset_step``. Returns how many
    streams were trimmed."""
    comms = np.unique(tab.comm_hash[inc.streams])
    idx = np.flatnonzero(tab.active & np.isin(tab.comm_hash, comms) & (tab.job_code == tab.jobs.get(inc.job, -2))
                         & tab.banks[0].warming_up[: tab.active.size])
    idx = idx[~np.isin(idx, inc.streams)]
    if tab.early.saved:
        idx = idx[~np.isin(idx, list(tab.early.saved))]
    if idx.size == 0:
        return 0
    rows, counts = tab.banks[0].warm_samples(idx)
    keep = np.maximum(counts - _samples_since(tab, idx, inc.onset_step), 0)
    cut = keep < counts
    idx, rows, keep = idx[cut], rows[cut], keep[cut]
    if idx.size == 0:
        return 0
    for bank in tab.banks:
        bank.resume_warmup(idx, rows, keep)
    return int(idx.size)
