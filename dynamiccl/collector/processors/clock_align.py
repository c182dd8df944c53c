"""Per-host clock alignment: a host whose clock stepped (an NTP step, a restart with a bad RTC) has
its records' times moved back in line before they are windowed.

Why: records are windowed by their sender's clock. A host whose clock runs 5 s ahead puts its
records five windows away from its peers' records of the same collectives: each window then
holds instances on part of the ranks, a stream's rank set flips, and rank offsets (who arrived
late) compare different collectives.

Rule: the ranks of a collective finish it together (each waits for the last to arrive, then the
data moves), so within one instance (communicator, collective, ``seq_number``) the finish times of
its ranks agree to a transfer step, whoever was late to start it; a straggler's late *start*
does not move its finish. An instance seen on at least ``MIN_HOSTS`` hosts gives each host its
finish minus the instance's median finish (after the host's current correction). When its last
``MIN_INSTANCES`` residuals are all more than ``threshold_s`` from zero on the same side, the
host's correction moves by their median: its later records' times (enqueue, GPU start/end, CPU
end) are shifted by the correction, durations unchanged. Two-host communicators give no estimate (which clock is wrong is not known),
nor do send/recv (not synchronising) or untimed records.

Cost: only instances with ``seq_number % SAMPLE == 0`` are remembered (the same instances on every
rank), at most ``PENDING`` of them between two estimates, in a ring of ``CAPACITY`` entries; the
estimate runs once per window of event time.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from dynamiccl.collector.wire_format import Kind, TimingSource

__all__ = ["ClockAlign", "TIME_FIELDS"]

TIME_FIELDS = ("enqueue_ns", "gpu_start_ns", "gpu_end_ns", "cpu_end_ns")
SAMPLE = 8            # remember instances with seq_number % SAMPLE == 0 (a power of 2)
_MASK = np.uint64(SAMPLE - 1)
CAPACITY = 1 << 14    # remembered (instance, host) finishes (32 bytes each)
PENDING = 1 << 12     # sampled records waiting to be filed, the newest kept (128 bytes each)
MIN_HOSTS = 3         # an instance's median finish needs this many hosts
MIN_INSTANCES = 4     # a host's step needs its last this many instances beyond the threshold


class ClockAlign:
    """Per-host time corrections (ns) learned from instance finish times (module doc)."""

    def __init__(self, threshold_s: float, *, max_hosts: int = 1 << 16):
        self.threshold_ns = int(round(threshold_s * 1e9))
        self.enabled = self.threshold_ns > 0
        self.max_hosts = max_hosts
        self.offset_ns = np.zeros(64, np.int64)       # per host code: subtracted from its times
        self._key = np.zeros(CAPACITY, np.uint64)      # instance key
        self._host = np.full(CAPACITY, -1, np.int64)
        self._end = np.zeros(CAPACITY, np.int64)       # finish, corrected when observed
        self._stamp = np.zeros(CAPACITY, np.int64)     # write order (age)
        self._n = 0                                    # entries ever written (ring cursor)
        self._pending: deque = deque()                 # (host, gcomm, records) sampled, not yet filed
        self._pending_n = 0
        self.steps = 0                                 # corrections made
        self.corrected = 0                             # records whose times were moved

    def correct(self, host: int, ev: np.ndarray) -> np.ndarray:
        """``ev`` with host ``host``'s correction applied (a copy; ``ev`` itself when none)."""
        if not self.enabled or host >= self.offset_ns.size or self.offset_ns[host] == 0:
            return ev
        off = int(self.offset_ns[host])
        ev = ev.copy()
        for f in TIME_FIELDS:
            col = ev[f].view(np.int64)
            np.subtract(col, off, out=col, where=col > 0)
        self.corrected += len(ev)
        return ev

    def observe(self, host: int, gcomm: np.ndarray, ev: np.ndarray) -> None:
        """Keep the sampled instances of one (corrected) batch of host ``host``; they are filed at
        the next `update` (per batch only the sample is taken: the collector's hot path)."""
        if not self.enabled or host >= self.max_hosts:
            return
        idx = np.flatnonzero((ev["seq_number"] & _MASK) == 0)
        if idx.size:
            # ev.take: a structured array's boolean index copies field by field (6x slower)
            self._pending.append((host, gcomm.take(idx), ev.take(idx)))
            self._pending_n += idx.size
            while self._pending_n - len(self._pending[0][2]) >= PENDING:   # bounded: a flood keeps the newest
                self._pending_n -= len(self._pending.popleft()[2])

    def _file(self) -> None:
        """The pending samples into the ring: collectives with a timing, as (instance, host, finish)."""
        pend, self._pending, self._pending_n = self._pending, deque(), 0
        if not pend:
            return
        hosts = np.concatenate([np.full(len(e), h, np.int64) for h, _, e in pend])
        gcomm = np.concatenate([g for _, g, _ in pend])
        ev = np.concatenate([e for _, _, e in pend])
        ts = ev["timing_source"]
        ok = (ev["kind"] == Kind.COLL) & (gcomm >= 0) & ((ts == TimingSource.KERNEL_GPU) | (ts == TimingSource.KERNEL_CPU))
        if not ok.all():
            hosts, gcomm, ev, ts = hosts[ok], gcomm[ok], ev[ok], ts[ok]
        if ev.size == 0:
            return
        if ev.size > CAPACITY:
            hosts, gcomm, ev, ts = hosts[-CAPACITY:], gcomm[-CAPACITY:], ev[-CAPACITY:], ts[-CAPACITY:]
        top = int(hosts.max())
        if top >= self.offset_ns.size:
            self.offset_ns = np.concatenate([self.offset_ns, np.zeros(max(top + 1, 2 * self.offset_ns.size)
                                                                      - self.offset_ns.size, np.int64)])
        end = np.where(ts == TimingSource.KERNEL_GPU, ev["gpu_end_ns"], ev["cpu_end_ns"]).view(np.int64)
        key = ((gcomm.astype(np.uint64) << np.uint64(44)) ^ (ev["func"].astype(np.uint64) << np.uint64(40))
               ^ (ev["seq_number"].astype(np.uint64) & np.uint64((1 << 40) - 1)))
        stamp = self._n + np.arange(ev.size)
        pos = stamp % CAPACITY
        self._key[pos], self._host[pos], self._end[pos], self._stamp[pos] = key, hosts, end, stamp
        self._n += ev.size

    def update(self) -> list[tuple[int, int]]:
        """Re-estimate; returns (host, step ns) for each host whose correction moved."""
        if not self.enabled:
            return []
        self._file()
        if self._n == 0:
            return []
        m = min(self._n, CAPACITY)
        key, host, end = self._key[:m], self._host[:m], self._end[:m]
        resid, rhost, rorder = _residuals(key, host, end, self._stamp[:m])
        if resid.size == 0:
            return []
        out = []
        order = np.lexsort((rorder, rhost))
        rh, rr = rhost[order], resid[order]
        cuts = np.flatnonzero(np.diff(rh)) + 1
        for h_arr, r_arr in zip(np.split(rh, cuts), np.split(rr, cuts)):
            recent = r_arr[-MIN_INSTANCES:]
            if recent.size < MIN_INSTANCES:
                continue
            # a step: its last MIN_INSTANCES instances all beyond the threshold on one side
            step = int(np.median(recent))
            if np.all(recent > self.threshold_ns) or np.all(recent < -self.threshold_ns):
                h = int(h_arr[0])
                self.offset_ns[h] += step
                self._host[:m][host == h] = -1       # its remembered finishes predate the correction
                self.steps += 1
                out.append((h, step))
        return out


def _residuals(key: np.ndarray, host: np.ndarray, end: np.ndarray, stamp: np.ndarray):
    """Per remembered (instance, host) of an instance seen on >= MIN_HOSTS hosts: its finish minus
    the instance's median finish, its host and its write stamp (age order)."""
    none = (np.zeros(0, np.int64),) * 3
    pos = np.flatnonzero(host >= 0)
    if pos.size < MIN_HOSTS:
        return none
    # one finish per (instance, host), its earliest written: a host runs several ranks of an
    # instance (their finishes agree), and a re-created communicator may reuse sequence numbers
    pos = pos[np.lexsort((stamp[pos], host[pos], key[pos]))]
    first = np.r_[True, (key[pos][1:] != key[pos][:-1]) | (host[pos][1:] != host[pos][:-1])]
    pos = pos[first]
    order = pos[np.lexsort((end[pos], key[pos]))]      # by instance, then finish
    k = key[order]
    starts = np.r_[0, np.flatnonzero(k[1:] != k[:-1]) + 1]
    sizes = np.diff(np.r_[starts, k.size])
    big = sizes >= MIN_HOSTS
    if not big.any():
        return none
    e = end[order]
    lo, hi = starts + (sizes - 1) // 2, starts + sizes // 2     # the middle one(s) of each instance
    med = np.repeat((e[lo] // 2 + e[hi] // 2), sizes)
    sel = np.flatnonzero(np.repeat(big, sizes))
    return e[sel] - med[sel], host[order][sel], stamp[order][sel]
