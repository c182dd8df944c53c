"""The stream table's index: key hash -> dense slot (sorted arrays), slot allocation and
eviction of idle streams (their slots are reused)."""
from __future__ import annotations

import numpy as np
import polars as pl

from .stream_columns import reset_columns
from .step_rate import STEP_FUNC
from .stream_group import STREAM_KEY

__all__ = ["StreamIndex"]


class StreamIndex:
    """Mixin of `StreamTable`: the slot of each stream key."""

    def _lookup(self, agg: pl.DataFrame, h: np.ndarray) -> np.ndarray:
        # the collector emits keys in a stable order: the same hashes as last window → same slots
        prev = self._prev_lookup
        if prev is not None and prev[0].shape == h.shape and np.array_equal(prev[0], h):
            return prev[1].copy()
        hs = self._hash_sorted
        if len(hs):
            order = np.argsort(h, kind="stable")       # sorted queries: cache-friendly search
            pos = np.empty(len(h), np.int64)
            pos[order] = np.searchsorted(hs, h[order])
            pos_c = np.minimum(pos, len(hs) - 1)
            found = (pos < len(hs)) & (hs[pos_c] == h)
            idx = np.where(found, self._hash_idx[pos_c], -1).astype(np.int64)
        else:
            found = np.zeros(len(h), bool)
            idx = np.full(len(h), -1, np.int64)
        if not found.all():
            new_rows = np.flatnonzero(~found)
            new_h, first = np.unique(h[new_rows], return_index=True)
            rows = new_rows[first]
            cols = {c: agg.get_column(c).to_list() for c in (*STREAM_KEY, "comm_name", "nnodes")}
            assigned = np.full(len(new_h), -1, np.int64)
            for j, r in enumerate(rows.tolist()):
                slot = self._allocate()
                if slot < 0:
                    break
                assigned[j] = slot
                key = tuple(cols[c][r] for c in STREAM_KEY)
                self.key_of[slot] = key
                self.job[slot] = key[0]
                self.job_code[slot] = self.jobs.setdefault(key[0], len(self.jobs))
                self.comm_hash[slot] = key[1]
                self.func[slot] = key[2]
                self.is_step[slot] = key[2] == STEP_FUNC
                self.size_bucket[slot] = key[3]
                self.comm_name[slot] = cols["comm_name"][r] or f"{key[1]:x}"
                self.nnodes[slot] = cols["nnodes"][r] or 1
                self.active[slot] = True
            ok = assigned >= 0
            self.n_dropped_streams += int((~ok).sum())
            self._retarget()
            if ok.any():
                all_h = np.concatenate([hs, new_h[ok]])
                all_i = np.concatenate([self._hash_idx, assigned[ok]])
                order = np.argsort(all_h, kind="stable")
                self._hash_sorted, self._hash_idx = all_h[order], all_i[order]
            lookup = dict(zip(new_h.tolist(), assigned.tolist()))
            idx[new_rows] = [lookup[v] for v in h[new_rows].tolist()]
        self._prev_lookup = (h.copy(), idx.copy())
        return idx

    def _allocate(self) -> int:
        if self._free:
            return self._free.pop()
        if self.n >= self.config.streams.max_streams:
            return -1
        if self.n >= self.capacity:
            self._grow(self.n + 1)
        self.n += 1
        return self.n - 1

    def _evict(self, now: float) -> None:
        idle = np.flatnonzero(self.active & (self.last_seen < now - self.config.streams.idle_s))
        if idle.size == 0:
            return
        self.last_evicted = idle
        self._prev_lookup = None
        keep = ~np.isin(self._hash_idx, idle)
        self._hash_sorted, self._hash_idx = self._hash_sorted[keep], self._hash_idx[keep]
        for bank in self.banks:
            bank.reset_streams(idle)
        self.active[idle] = False
        reset_columns(self, idle)
        self.ss.n[idle] = 0
        self.early.forget(idle)
        self.warm_stash.forget(idle)
        self.pool.forget(idle)
        self.hist[:, idle] = np.nan
        for i in idle.tolist():
            self.key_of.pop(i, None)
            self._free.append(i)
        self._retarget()
