"""The retuner of a job split by communicator (``dynamiccl central --partitions JOB=P --retune``): its
windows from every partition, its changes from the job's combiner, handed to it in the loop's order.

What crosses the bus (in each partition's :class:`~.combiner.Note`, so under the change subject's
permissions: shard users only): the columns of the window's ``keys`` the retuner and its input gate
read (:data:`RETUNER_COLUMNS`; ``state.observations_from_window``, ``inputs.InputGate.window``), as
JSON columns, plus the window's start, length and whether every input authenticated. A communicator
lies in one partition, so the partitions' rows are disjoint and together are the whole job's rows:
:class:`WindowJoin` concatenates them, in the whole job's row order (by communicator; each
partition's rows keep their order within a communicator, which is the merged window's), once every
partition reported the window or ``lateness_s`` after the first one did (the absent counted), each
window once (a duplicate or a late partition counted and ignored) and in window order.

:class:`JobFeed` gives the job's retuner what the single machine's loop would: window ``w``, then the
combined changes detected in it, then the transients it closed. A window waits while the combiner
holds an open group detected at or before its end (a change that belongs before the next window may
still be released); a transient of the whole job ends when every partition whose change the combined
one merged has ended its own (one recovery, naming the combined change).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable

import polars as pl

from dynamiccl.collector.features import KEYS_SCHEMA, WindowFeatures, empty_ranks
from dynamiccl.detector.events import RegimeChange, TransientEnd

__all__ = ["RETUNER_COLUMNS", "window_rows", "rows_frame", "WindowJoin", "JobFeed", "transient_json",
           "transient_of"]

#: what the retuner reads of a window's keys (its observations; ``job_id``, the gate's, is the note's job)
RETUNER_COLUMNS = ("comm_hash", "comm_name", "func", "algo", "proto", "size_bucket", "nranks", "nnodes",
                   "instances", "lat_mean_s", "lat_p50_s", "lat_p90_s", "tuner_config_version")
MAX_ROWS = 100_000             # per partition window (a note is at most 1 MiB anyway)
_TRANSIENT_FIELDS = ("id", "ends", "start_s", "detected_s", "magnitude", "comms", "comm_names", "funcs",
                     "size_buckets", "ranks", "hosts")


def window_rows(wf: WindowFeatures) -> dict:
    """One partition's window as the retuner needs it (JSON-ready)."""
    keys = wf.keys
    cols = {}
    for c in RETUNER_COLUMNS:
        if c in keys.columns:
            s = keys.get_column(c)
            cols[c] = (s.fill_nan(None) if s.dtype.is_float() else s).to_list()
    return {"start": float(wf.window_start), "s": float(wf.window_s),
            "auth": int(int(wf.counters.get("inputs_authenticated", 0)) == 1), "cols": cols}


def rows_frame(job: str, d: Any) -> tuple[float, float, int, pl.DataFrame]:
    """(start, length, authenticated, keys) of :func:`window_rows`'s dict from the bus; ValueError naming
    what is wrong."""
    if not isinstance(d, dict) or not isinstance(d.get("cols"), dict):
        raise ValueError("window rows: expected an object with 'cols'")
    start, length, auth = float(d["start"]), float(d["s"]), d["auth"]
    if not (math.isfinite(start) and math.isfinite(length) and length > 0) or auth not in (0, 1):
        raise ValueError(f"window rows: start {start}, length {length}, auth {auth!r}")
    cols = d["cols"]
    missing = [c for c in RETUNER_COLUMNS[:-1] if c not in cols]
    unknown = [c for c in cols if c not in RETUNER_COLUMNS]
    if missing or unknown:
        raise ValueError(f"window rows: missing column(s) {missing}, unknown {unknown}")
    n = {len(v) if isinstance(v, list) else -1 for v in cols.values()}
    if len(n) != 1 or not 0 <= next(iter(n)) <= MAX_ROWS:
        raise ValueError(f"window rows: columns of lengths {sorted(n)} (equal lists, at most {MAX_ROWS} rows)")
    schema = {c: KEYS_SCHEMA[c] for c in cols}
    try:
        keys = pl.DataFrame(cols, schema=schema, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError) as e:
        raise ValueError(f"window rows: {type(e).__name__}: {str(e)[:200]}") from None
    return start, length, auth, keys.with_columns(pl.lit(job, pl.String).alias("job_id"))


def transient_json(te: TransientEnd) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k in _TRANSIENT_FIELDS for v in (getattr(te, k),)}


def transient_of(job: str, d: Any) -> TransientEnd:
    if not isinstance(d, dict):
        raise ValueError("transient end: expected an object")
    te = TransientEnd(id=str(d["id"]), job_id=job, ends=tuple(str(x) for x in d["ends"]),
                      start_s=float(d["start_s"]), detected_s=float(d["detected_s"]), magnitude=float(d["magnitude"]),
                      **{k: tuple(d.get(k) or ()) for k in _TRANSIENT_FIELDS[6:]})
    te.as_recovery()                          # ValueError when it could not stand for a recovery
    return te


class WindowJoin:
    """The partitions' rows of each window → the job's window, in window order, each once."""

    def __init__(self, job: str, partitions: int, clock: Callable[[], float], *, lateness_s: float = 10.0,
                 max_pending: int = 64, counters: dict | None = None):
        self.job, self.partitions, self.clock = job, partitions, clock
        self.lateness_s, self.max_pending = lateness_s, max_pending
        self._pending: dict[int, dict] = {}      # window index -> {"first": t, "parts": {p: (start, s, auth, keys)}}
        self.done = -(1 << 62)                   # the last window index released
        self.counters = counters if counters is not None else {}
        for k in ("windows_joined", "windows_partial", "partitions_missing", "windows_late", "windows_duplicate",
                  "windows_forced"):
            self.counters.setdefault(f"retuner_{k}", 0)

    def _count(self, what: str, n: int = 1) -> None:
        self.counters[f"retuner_{what}"] += n

    def add(self, partition: int, rows: tuple[float, float, int, pl.DataFrame]) -> None:
        w = round(rows[0] / rows[1])
        if w <= self.done:
            self._count("windows_late")
            return
        slot = self._pending.setdefault(w, {"first": self.clock(), "parts": {}})
        if partition in slot["parts"]:
            self._count("windows_duplicate")   # redelivered (a partition's owner moved): the first stands
            return
        slot["parts"][partition] = rows

    def peek(self) -> int | None:
        """The next window index that may go (complete, past its lateness, or pushed out by the bound)."""
        w = self.oldest()
        if w is None:
            return None
        slot = self._pending[w]
        complete = len(slot["parts"]) == self.partitions
        if complete or self.clock() - slot["first"] >= self.lateness_s or len(self._pending) > self.max_pending:
            return w
        return None

    def oldest(self) -> int | None:
        return min(self._pending) if self._pending else None

    def end(self, w: int) -> float:
        start, length = next(iter(self._pending[w]["parts"].values()))[:2]
        return start + length

    def first(self, w: int) -> float:
        """When the window's first partition reported (this host's clock)."""
        return self._pending[w]["first"]

    def pop(self, w: int, *, bus_authenticated: bool) -> WindowFeatures:
        slot = self._pending.pop(w)
        parts = [slot["parts"][p] for p in sorted(slot["parts"])]
        missing = self.partitions - len(parts)
        if missing:
            self._count("windows_partial")
            self._count("partitions_missing", missing)
            if len(self._pending) >= self.max_pending and self.clock() - slot["first"] < self.lateness_s:
                self._count("windows_forced")
        self._count("windows_joined")
        self.done = w
        # the merged window's rows are sorted by communicator first: a stable sort by it interleaves the
        # partitions' blocks into that order without reordering a communicator's rows
        keys = pl.concat([r[3].select(sorted(r[3].columns)) for r in parts], how="diagonal_relaxed")
        keys = keys.sort("comm_hash", maintain_order=True)
        auth = int(bus_authenticated and not missing and all(r[2] == 1 for r in parts))
        start, length = parts[0][0], parts[0][1]
        return WindowFeatures(start, length, keys, empty_ranks(),
                              {"inputs_authenticated": auth, "partitions_missing": missing})

    def drop_all(self) -> int:
        n = len(self._pending)
        self._pending.clear()
        return n


class JobFeed:
    """One partitioned job's retuner fed in the loop's order. ``retuner``: ``on_window``,
    ``on_change``, ``on_transient_end`` (a ``JobRetuner``); ``combined_id(p, id)`` and
    ``open_detected()``: the job's combiner's (``ChangeCombiner``)."""

    def __init__(self, job: str, partitions: int, retuner: Any, combiner: Any, clock: Callable[[], float], *,
                 bus_authenticated: bool, lateness_s: float = 10.0, max_held: int = 256, counters: dict | None = None):
        self.job, self.retuner, self.combiner, self.clock = job, retuner, combiner, clock
        self.bus_authenticated, self.lateness_s, self.max_held = bus_authenticated, lateness_s, max_held
        self.counters = counters if counters is not None else {}
        self.join = WindowJoin(job, partitions, clock, lateness_s=lateness_s, counters=self.counters)
        self._changes: list[tuple[float, RegimeChange]] = []        # (arrival, change) not yet handed
        self._ended: list[tuple[int, float, TransientEnd]] = []     # (partition, window end, transient)
        self._members: OrderedDict[str, set[int]] = OrderedDict()   # combined id -> partitions yet to end it
        self._last_end = -math.inf
        for k in ("windows", "changes", "changes_late", "transient_ends", "transients_unmatched", "transients_dropped",
                  "versions"):
            self.counters.setdefault(f"retuner_{k}", 0)

    def _count(self, what: str, n: int = 1) -> None:
        self.counters[f"retuner_{what}"] += n

    def window(self, partition: int, rows, ended: tuple[TransientEnd, ...] = ()) -> None:
        self.join.add(partition, rows)
        end = rows[0] + rows[1]
        self._ended.extend((partition, end, te) for te in ended)
        over = len(self._ended) - self.max_held
        if over > 0:                           # bounded: a flood of transients drops the oldest, counted
            self._count("transients_dropped", over)
            del self._ended[:over]

    def changes(self, changes) -> None:
        now = self.clock()
        self._changes.extend((now, c) for c in changes)

    def run(self) -> None:
        """Hand the retuner every window that can go, each followed by its changes and transients."""
        while (w := self.join.peek()) is not None:
            end, waited = self.join.end(w), self.clock() - self.join.first(w)
            if self.combiner.open_detected() <= end and waited < self.lateness_s:
                break                          # a change that belongs at or before this window is still forming
            self._hand_window(self.join.pop(w, bus_authenticated=self.bus_authenticated), end)
        self._hand_changes(self._last_end, late=True)

    def _hand_window(self, wf: WindowFeatures, end: float) -> None:
        self._count("windows")
        self._version(self.retuner.on_window(wf))
        self._hand_changes(end)
        self._last_end = max(self._last_end, end)
        due = [x for x in self._ended if x[1] <= end]
        self._ended = [x for x in self._ended if x[1] > end]
        for p, _, te in due:
            self._transient(p, te)

    def _hand_changes(self, end: float, late: bool = False) -> None:
        # a change waits for its window, but no longer than the lateness (no window may ever come: a
        # partition whose shard forwards none) and never more than max_held of them
        now, crowded = self.clock(), len(self._changes) > self.max_held
        due = sorted((c for c in self._changes if c[1].detected_s <= end or crowded
                      or now - c[0] >= self.lateness_s), key=lambda c: c[1].detected_s)
        if not due:
            return
        ids = {id(c) for c in due}
        self._changes = [c for c in self._changes if id(c) not in ids]
        for _, rc in due:
            self._count("changes")
            self._count("changes_late", late)
            merged = rc.evidence.get("merged") if isinstance(rc.evidence, dict) else None
            self._members[rc.id] = {m["partition"] for m in merged} if isinstance(merged, list) else set()
            while len(self._members) > 4096:
                self._members.popitem(last=False)
            self._version(self.retuner.on_change(rc))

    def _transient(self, partition: int, te: TransientEnd) -> None:
        """A partition's transient closed; the job's ends when the last of its member partitions' does."""
        cids = [self.combiner.combined_id(partition, e) for e in te.ends]
        cid = next((c for c in cids if c in self._members), None)
        if cid is None:
            self._count("transients_unmatched")   # its change never reached the retuner: nothing to revert
            return
        left = self._members[cid]
        left.discard(partition)
        if left:
            return
        del self._members[cid]
        self._count("transient_ends")
        self._version(self.retuner.on_transient_end(replace(te, job_id=self.job, ends=tuple(c for c in cids if c))))

    def _version(self, v) -> None:
        self._count("versions", v is not None)

    def flush(self) -> None:
        """Everything held, in order (the shard stops): windows as they are, then the changes left."""
        while (w := self.join.oldest()) is not None:
            end = self.join.end(w)
            self._hand_window(self.join.pop(w, bus_authenticated=self.bus_authenticated), end)
        self._hand_changes(math.inf, late=True)
