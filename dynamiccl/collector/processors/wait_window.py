"""The wait streams' wiring into the window aggregator (processors/window_agg.py): the records dropped while a
window was open (the lossy rule's input, processors/wait.py) and the waits attached when the window closes."""
from __future__ import annotations

import numpy as np

from dynamiccl.collector.processors.wait import LOSSY_SCOPES, LostRecords, lossy_records, window_waits

__all__ = ["WaitWiring"]


class WaitWiring:
    """Records dropped as late / too early since the last window closed (``LostRecords``: per (job,
    communicator) code, per job code past MAX_LOSSY_COMMS communicators), and the close-time step that
    attaches a window's waits."""

    def __init__(self) -> None:
        self.lost = LostRecords()

    def dropped(self, job: int, gcomm: np.ndarray, metrics) -> None:
        """Records of job code ``job`` dropped as late or too early; ``gcomm``: their (job, communicator)
        codes (-1: communicator unknown, counted against the job)."""
        folded = self.lost.dropped(job, gcomm)
        if folded:
            metrics.add("wait_lossy_folded", folded)

    def close(self, agg, result, view: dict[str, np.ndarray], w: int):
        """The window's features with its wait streams attached (processors/wait.py), outcomes counted in
        ``agg.metrics`` (``agg``: the WindowAggregator, for its code tables and aggregation)."""
        from dynamiccl.collector.processors.aggregate import aggregate_window

        comms, jobs = self.lost.take()
        lossy = job_of = None
        if comms or jobs:                    # a window that lost nothing pays nothing here
            job_of = np.array([j for j, _ in agg.gcomms.values], np.int64)
            lossy = lossy_records(job_of, view["kc"], comms, jobs)
        cfg = agg.config
        window_start_ns = int(round(cfg.window_s * 1e9)) * w
        features, counts = window_waits(
            result, view, max_wait_s=cfg.max_wait_s, lossy=lossy,
            aggregate=lambda sub: aggregate_window(sub, window_start_ns=window_start_ns,
                                                   window_s=cfg.window_s, aggregator=agg),
            metrics=agg.metrics)
        if job_of is not None and counts.lossy_groups is not None and len(counts.lossy_groups):
            jobs_, n = np.unique(job_of[counts.lossy_groups >> 4], return_counts=True)
            agg.metrics.wait_lossy_jobs({agg.jobs.values[j]: int(k) for j, k in zip(jobs_.tolist(), n.tolist())})
            scope = np.bincount(counts.lossy_scope, minlength=max(LOSSY_SCOPES) + 1)
            agg.metrics.wait_lossy_scopes({name: int(scope[s]) for s, name in LOSSY_SCOPES.items()})
        return features
