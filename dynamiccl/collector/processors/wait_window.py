"""The wait streams' wiring into the window aggregator (processors/window_agg.py): the records dropped while a
window was open (the lossy rule's input, processors/wait.py; drops outside the aggregator arrive as notes,
processors/wait_losses.py) and the waits attached when the window closes."""
from __future__ import annotations

import numpy as np

from dynamiccl.collector.processors.wait import LOSSY_JOB, LOSSY_SCOPES, LostRecords, lossy_records, window_waits
from dynamiccl.collector.processors.wait_losses import LossLedger, LossNote, note_windows

__all__ = ["WaitWiring"]


class WaitWiring:
    """Records dropped as late / too early since the last window closed (``LostRecords``: per (job,
    communicator) code, per job code past MAX_LOSSY_COMMS communicators), and the close-time step that
    attaches a window's waits."""

    def __init__(self) -> None:
        self.lost = LostRecords()
        #: drops attributed to a window still open or not open yet (window_full, notes), per window; the
        #: windows are those from the next to close to ``max_open_windows`` past the newest open one
        self.at: dict[int, LostRecords] = {}
        #: windows open when a note was refused (the ledger full) or its job had no code: every job withheld
        self.every_job: set[int] = set()
        self.ledger = LossLedger()

    def dropped(self, job: int, gcomm: np.ndarray, metrics, cause: str | None = "late",
                w: int | None = None) -> None:
        """Records of job code ``job`` dropped (``cause``; None: counted by the caller) while the next window
        to close was open, or attributed to window ``w``; ``gcomm``: their (job, communicator) codes (-1:
        communicator unknown, counted against the job)."""
        lost = self.lost if w is None else self.at.setdefault(w, LostRecords())
        folded = lost.dropped(job, gcomm)
        if cause is not None:
            metrics.wait_lossy_causes({cause: len(gcomm)})
        if folded:
            metrics.add("wait_lossy_folded", folded)

    def _apply_notes(self, agg, closing: int) -> None:
        """The notes of drops outside the aggregator (wait_losses.py), attributed as its table says."""
        notes, refused = self.ledger.take()
        if not notes and not refused:
            return
        open_w = [closing, *sorted(agg._open)]
        if refused:
            self.every_job.update(open_w)
            agg.metrics.wait_lossy_causes({"ledger_full": refused})
        for note in notes:
            self._apply_note(agg, note, closing, open_w)

    def _apply_note(self, agg, note: LossNote, closing: int, open_w: list[int]) -> None:
        job = agg.jobs.get(note.job_id)
        if job < 0:                                      # no job code left: every job, conservatively
            self.every_job.update(open_w)
            agg.metrics.wait_lossy_causes({note.cause: note.n})
            return
        agg.metrics.wait_lossy_causes({note.cause: note.n})   # once, however many windows it marks
        ws = note_windows(note, closing, open_w, agg._window_ns, agg.config.max_open_windows)
        if note.events is None:                           # a delivery gap: the job, no communicator
            for w in ws.tolist():
                self.at.setdefault(w, LostRecords()).dropped_job(job, note.n)
            return
        gcomm = agg._gcomm_codes(job, note.events["comm_hash"])
        if len(ws) != len(gcomm):                        # the records' windows unknown: each window marked
            for w in ws.tolist():
                self.dropped(job, gcomm, agg.metrics, None, w)
            return
        for w in np.unique(ws).tolist():
            self.dropped(job, gcomm[ws == w], agg.metrics, None, w)

    def _take(self, agg, w: int) -> tuple[dict[int, int], dict[int, int], bool]:
        """Window ``w``'s losses (per communicator code, per job code, whether every job's): the drops since
        the last close and those attributed to ``w``; the older windows' marks are forgotten (closed)."""
        self._apply_notes(agg, w)
        comms, jobs = self.lost.take()
        if w in self.at:
            for mine, theirs in zip((comms, jobs), self.at.pop(w).take()):
                for k, v in theirs.items():
                    mine[k] = mine.get(k, 0) + v
        every_job = w in self.every_job
        self.at = {k: v for k, v in self.at.items() if k > w}
        self.every_job = {k for k in self.every_job if k > w}
        return comms, jobs, every_job

    def close(self, agg, result, view: dict[str, np.ndarray], w: int):
        """The window's features with its wait streams attached (processors/wait.py), outcomes counted in
        ``agg.metrics`` (``agg``: the WindowAggregator, for its code tables and aggregation)."""
        from dynamiccl.collector.processors.aggregate import aggregate_window

        comms, jobs, every_job = self._take(agg, w)
        lossy = job_of = None
        if comms or jobs or every_job:       # a window that lost nothing pays nothing here
            job_of = np.array([j for j, _ in agg.gcomms.values], np.int64)
            lossy = (np.full(len(view["kc"]), LOSSY_JOB, np.uint8) if every_job
                     else lossy_records(job_of, view["kc"], comms, jobs))
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
