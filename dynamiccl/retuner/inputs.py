"""The retuner service's input gate: it acts only on allow-listed jobs and communicators, and
(unless told otherwise) only on windows from a collector whose every network peer authenticated.

* ``jobs``: fnmatch patterns for ``job_id``; rows and regime changes of other jobs are dropped
  (``inputs_dropped_total{reason="not_allowed"}``). Applying (``dry_run=False``) needs at least one.
* ``comms``: patterns for a communicator's name or ``0x``-hash; empty: every communicator of an
  allowed job.
* A window whose ``counters["inputs_authenticated"]`` is not 1 is dropped
  (``reason="unauthenticated"``) unless ``allow_unauthenticated``; a regime change is accepted only
  for a job seen in an accepted window (the detector derives changes from the same windows).
"""
from __future__ import annotations

import fnmatch
import json
from collections import OrderedDict

import polars as pl

__all__ = ["InputGate"]

MAX_JOBS_SEEN = 4096


def _any(patterns: tuple[str, ...], values) -> bool:
    return any(fnmatch.fnmatchcase(str(v), p) for p in patterns for v in values if v)


class InputGate:
    def __init__(self, *, jobs: tuple[str, ...], comms: tuple[str, ...], allow_unauthenticated: bool, metrics):
        self.jobs, self.comms = tuple(jobs), tuple(comms)
        self.allow_unauthenticated = allow_unauthenticated
        self.metrics = metrics
        self._seen: OrderedDict[str, None] = OrderedDict()  # jobs with an accepted window (bounded)

    def window(self, wf):
        """The window with only allowed rows, or None (dropped and counted)."""
        if not self.allow_unauthenticated and int(wf.counters.get("inputs_authenticated", 0)) != 1:
            self.metrics.drop("unauthenticated")
            return None
        keys = wf.keys
        if keys is None or keys.height == 0:
            return wf
        hexes = keys["comm_hash"].map_elements(lambda h: f"0x{int(h):x}", return_dtype=pl.String)
        ok = [self._job_ok(j) and (not self.comms or _any(self.comms, (n, x)))
              for j, n, x in zip(keys["job_id"].to_list(), keys["comm_name"].to_list(), hexes.to_list())]
        n_bad = len(ok) - sum(ok)
        if n_bad:
            self.metrics.drop("not_allowed", n_bad)
        if not any(ok):
            return None
        for j in set(keys.filter(pl.Series(ok))["job_id"].to_list()):
            self._seen[j] = None
            self._seen.move_to_end(j)
            if len(self._seen) > MAX_JOBS_SEEN:
                self._seen.popitem(last=False)
        if n_bad:
            wf.keys = keys.filter(pl.Series(ok))
            if wf.ranks is not None and "job_id" in wf.ranks.columns:
                wf.ranks = wf.ranks.filter(pl.col("job_id").map_elements(self._job_ok, return_dtype=pl.Boolean))
        return wf

    def change(self, line) -> bool:
        """Whether a regime-change line may reach the retuner (malformed lines pass: it counts them)."""
        try:
            d = json.loads(line)
            job = d["job_id"]
            comms = list(d.get("comm_names") or []) + list(d.get("comms") or [])
        except (ValueError, KeyError, TypeError):
            return True
        if not self._job_ok(job) or (self.comms and not _any(self.comms, comms)):
            self.metrics.drop("not_allowed")
            return False
        if not self.allow_unauthenticated and job not in self._seen:
            self.metrics.drop("unauthenticated")
            return False
        return True

    def _job_ok(self, job) -> bool:
        return _any(self.jobs, (job,))
