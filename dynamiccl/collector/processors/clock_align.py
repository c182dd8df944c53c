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
end) are shifted by the correction, durations unchanged. Send/recv (not synchronising) and
untimed records give no estimate.

Two hosts: a host seen only in two-host instances is compared with the *later* finish of each,
so the host that falls behind trips. Which of the two clocks stepped is told by each host's own
timeline: across the step, the host that stepped sees the interval between two consecutive
sampled instances grow or shrink by the step, its partner sees the usual interval (the median of
the pair's earlier intervals). That host's correction moves; when the timeline cannot tell (too
few earlier intervals, or both as far from the usual), the host behind is moved forward, which
runs the job's event time on and puts no record behind the windows. A host seen in an instance
of ``MIN_HOSTS`` or more is judged on those only (its partner in a pair may be the host that
stepped).

Cost: only instances with ``seq_number % SAMPLE == 0`` are remembered (the same instances on every
rank), at most ``PENDING`` of them between two estimates, in a ring of ``CAPACITY`` entries; the
estimate runs once per window of event time. A communicator with fewer than ``MIN_INSTANCES`` such
instances in a window (a step-paced job: one all-reduce per step) has every instance remembered
from the next estimate on, so that its step is seen after ``MIN_INSTANCES`` instances, not
``SAMPLE`` times as many (80 s at one instance per 2.5 s step); that costs no more than the
sample of a fast one.
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
        self._every = np.zeros(64, bool)              # per global communicator: remember every instance
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
        pick = (ev["seq_number"] & _MASK) == 0
        if self._every.any():
            g = np.clip(gcomm, 0, self._every.size - 1)
            pick |= self._every[g] & (gcomm >= 0) & (gcomm < self._every.size)
        idx = np.flatnonzero(pick)
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
        self.offset_ns = _covering(self.offset_ns, int(hosts.max()))
        self._rates(gcomm, ev["seq_number"])
        end = np.where(ts == TimingSource.KERNEL_GPU, ev["gpu_end_ns"], ev["cpu_end_ns"]).view(np.int64)
        key = ((gcomm.astype(np.uint64) << np.uint64(44)) ^ (ev["func"].astype(np.uint64) << np.uint64(40))
               ^ (ev["seq_number"].astype(np.uint64) & np.uint64((1 << 40) - 1)))
        stamp = self._n + np.arange(ev.size)
        pos = stamp % CAPACITY
        self._key[pos], self._host[pos], self._end[pos], self._stamp[pos] = key, hosts, end, stamp
        self._n += ev.size

    def _rates(self, gcomm: np.ndarray, seq: np.ndarray) -> None:
        """Communicators filed since the last estimate (one window of event time) with fewer than
        ``MIN_INSTANCES`` sampled instances have every instance remembered from now on; the
        others go back to the sample."""
        self._every = _covering(self._every, int(gcomm.max()))
        on = (seq & _MASK) == 0
        inst = np.unique((gcomm[on].astype(np.uint64) << np.uint64(40)) | (seq[on] & np.uint64((1 << 40) - 1)))
        n = np.bincount((inst >> np.uint64(40)).astype(np.int64), minlength=self._every.size)
        seen = np.unique(gcomm)
        self._every[seen] = n[seen] < MIN_INSTANCES

    def update(self) -> list[tuple[int, int]]:
        """Re-estimate; returns (host, step ns) for each host whose correction moved."""
        if not self.enabled:
            return []
        self._file()
        if self._n == 0:
            return []
        m = min(self._n, CAPACITY)
        key, host, end = self._key[:m], self._host[:m], self._end[:m]
        resid, rhost, rorder, rbig = _residuals(key, host, end, self._stamp[:m])
        if resid.size == 0:
            return []
        out = []
        order = np.lexsort((rorder, rhost))
        rh, rr, rb = rhost[order], resid[order], rbig[order]
        cuts = np.flatnonzero(np.diff(rh)) + 1
        for h_arr, r_arr, b_arr in zip(np.split(rh, cuts), np.split(rr, cuts), np.split(rb, cuts)):
            if b_arr.any():
                r_arr = r_arr[b_arr]          # judged by the median of many hosts where it has one
            recent = r_arr[-MIN_INSTANCES:]
            if recent.size < MIN_INSTANCES:
                continue
            # a step: its last MIN_INSTANCES instances all beyond the threshold on one side
            step = int(np.median(recent))
            if np.all(recent > self.threshold_ns) or np.all(recent < -self.threshold_ns):
                h = int(h_arr[0])
                if not b_arr.any():
                    h, step = _pair_mover(key, host, end, h, step, self.threshold_ns)
                self.offset_ns[h] += step
                self._host[:m][host == h] = -1       # its remembered finishes predate the correction
                self.steps += 1
                out.append((h, step))
        return out


def _covering(a: np.ndarray, top: int) -> np.ndarray:
    """``a`` grown with zeros (at least doubled) so that index ``top`` exists."""
    if top < a.size:
        return a
    return np.concatenate([a, np.zeros(max(top + 1, 2 * a.size) - a.size, a.dtype)])


def _pair_mover(key, host, end, behind: int, step: int, threshold: int) -> tuple[int, int]:
    """(host, step) to correct when ``behind`` trails its one partner by ``step`` (< 0) on its
    recent pair instances: the partner, by ``-step``, when the partner's timeline jumped and
    ``behind``'s did not (module doc); else ``behind`` itself. Runs only when a pair trips."""
    first: dict[int, int] = {}
    for i in np.flatnonzero(host == behind):
        first.setdefault(int(key[i]), int(i))
    other: dict[int, int] = {}
    for i in np.flatnonzero((host >= 0) & (host != behind)):
        if int(key[i]) in first:
            other.setdefault(int(key[i]), int(i))
    # one (communicator, collective) in sequence-number order: the order the job ran them in,
    # whatever either clock did (time order would interleave a clock stepped back)
    series: dict[int, list[int]] = {}
    for k in first:
        if k in other:
            series.setdefault(k >> 40, []).append(k)
    longest: list[int] = max(series.values(), key=lambda ks: len(ks), default=[])
    keys = sorted(longest, key=lambda k: k & ((1 << 40) - 1))
    if len(keys) < 4:
        return behind, step
    partner = int(host[other[keys[-1]]])
    e_b = np.array([end[first[k]] for k in keys], np.int64)
    e_p = np.array([end[other[k]] for k in keys], np.int64)
    level = np.abs(e_b - e_p) <= threshold
    before = np.flatnonzero(level[:-1] & ~level[1:])     # the last instance before the step
    if before.size == 0 or before[-1] < 2:
        return behind, step
    j = int(before[-1])
    usual = float(np.median(np.r_[np.diff(e_b[: j + 1]), np.diff(e_p[: j + 1])]))
    jump_b = abs(float(e_b[j + 1] - e_b[j]) - usual)
    jump_p = abs(float(e_p[j + 1] - e_p[j]) - usual)
    if jump_p > 2 * jump_b and jump_p > threshold / 2:
        return partner, -step
    return behind, step


def _residuals(key: np.ndarray, host: np.ndarray, end: np.ndarray, stamp: np.ndarray):
    """Per remembered (instance, host) of an instance seen on two or more hosts: its finish minus
    the instance's reference finish (the median of ``MIN_HOSTS`` or more hosts, the later of two),
    its host, its write stamp (age order) and whether the reference is a median."""
    none = (np.zeros(0, np.int64),) * 3 + (np.zeros(0, bool),)
    pos = np.flatnonzero(host >= 0)
    if pos.size < 2:
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
    seen = sizes >= 2
    if not seen.any():
        return none
    e = end[order]
    lo, hi = starts + (sizes - 1) // 2, starts + sizes // 2     # the middle one(s) of each instance
    ref = np.where(sizes == 2, e[hi], e[lo] // 2 + e[hi] // 2)  # of two: the later finish
    ref = np.repeat(ref, sizes)
    big = np.repeat(sizes >= MIN_HOSTS, sizes)
    sel = np.flatnonzero(np.repeat(seen, sizes))
    return e[sel] - ref[sel], host[order][sel], stamp[order][sel], big[sel]
