"""Segment reductions for the window close (:mod:`dynamiccl.collector.processors.aggregate`): per-group
sorts and quantiles by one packed u64 sort, dense ids through bincount lookup tables, order statistics and
each rank's enqueue / finish offsets within its instances; nothing loops over records in Python."""

from __future__ import annotations

import numpy as np
import polars as pl

_U = np.uint64
#: keys with at least this many records get exact quantiles by np.partition (a Python call each);
#: the rest share one packed u64 sort (relative error ≤ 4e-9)
PARTITION_MIN = 256


def _segments(gid: np.ndarray, values: np.ndarray, ngroups: int):
    """Sort ``values`` (≥ 0 or NaN; NaN sorts last) within groups: returns sorted values, starts, counts.

    One u64 sort of (gid << (64-g) | top (64-g) bits of the float), g = bits needed for the
    group id. With ≤ 2^24 groups the order is exact up to a relative 2^-28 (~4e-9) and values
    are gathered back from the truncated bits; more groups fall back to an exact lexsort.
    """
    counts = np.bincount(gid, minlength=ngroups)
    starts = np.zeros(ngroups, np.int64)
    if ngroups > 1:
        np.cumsum(counts[:-1], out=starts[1:])
    gbits = max(1, int(ngroups - 1).bit_length())
    if gbits <= 24:
        shift = _U(gbits)
        comp = values.view(_U) >> shift
        comp |= gid.astype(_U) << _U(64 - gbits)
        comp.sort()
        comp <<= shift
        vals = comp.view(np.float64)
    else:
        vals = values[np.lexsort((values, gid))]
    return vals, starts, counts


def _quantile(vals, starts, counts, q: float) -> np.ndarray:
    """Linear-interpolated quantile per segment (numpy's default method); NaN when empty."""
    out = np.full(len(counts), np.nan)
    ok = counts > 0
    pos = q * (counts[ok] - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, counts[ok] - 1)
    frac = pos - lo
    a = vals[starts[ok] + lo]
    b = vals[starts[ok] + hi]
    out[ok] = a + (b - a) * frac
    return out


def _nan_to_null(a: np.ndarray) -> pl.Series:
    return pl.Series(values=a, dtype=pl.Float64, nan_to_null=True)


def _dense(codes: np.ndarray, limit: int = 1 << 23) -> tuple[np.ndarray, np.ndarray]:
    """Dense ids for non-negative int codes without sorting ``codes``: (ids, sorted unique codes).

    Direct addressing through a bincount when the code range is small (the usual case: codes
    are built from small dense parts); a sort-based np.unique otherwise.
    """
    if len(codes) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    m = int(codes.max()) + 1
    if m > limit:
        uniq, inv = np.unique(codes, return_inverse=True)
        return inv.astype(np.int64), uniq.astype(np.int64)
    uniq = np.flatnonzero(np.bincount(codes, minlength=m))
    lut = np.empty(m, np.int64)
    lut[uniq] = np.arange(len(uniq))
    return lut[codes], uniq


def _first_index(ids: np.ndarray, n_ids: int) -> np.ndarray:
    """Index of the first record of each id (every id in 0..n_ids-1 must occur)."""
    first = np.empty(n_ids, np.int64)
    first[ids[::-1]] = np.arange(len(ids) - 1, -1, -1)
    return first


def _key_ids(kc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense key ids (sorted by code) without sorting the records."""
    if len(kc) == 0 or int(kc.max()) < (1 << 22):
        return _dense(kc)
    gl, ug = _dense(kc >> 16)          # many communicators seen: compact the comm part first
    if len(ug) <= 128:
        kid, u = _dense((gl << 16) | (kc & 0xFFFF))
        return kid, (ug[u >> 16] << 16) | (u & 0xFFFF)
    return _dense(kc, limit=0)


def _order_stats(g: np.ndarray, starts: np.ndarray, seglen: np.ndarray, counts: np.ndarray,
                 qs: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per segment, the two order statistics around each quantile position q·(count−1).

    ``g`` holds the values grouped by segment (``starts``/``seglen``); invalid values are NaN and
    ``counts`` is the number of valid ones. Segments with ≥ PARTITION_MIN values: exact, by an
    in-place ``np.partition`` of the segment (``g`` is modified). Smaller ones: one packed u64 sort
    of all of them together (see :func:`_segments`, relative error ≤ 4e-9). Returns (lo, hi), each
    of shape (len(qs), n_segments), NaN where a segment has no valid value.
    """
    nk = len(counts)
    lo_v = np.full((len(qs), nk), np.nan)
    hi_v = np.full((len(qs), nk), np.nan)
    ok = counts > 0
    if not ok.any():
        return lo_v, hi_v
    c = np.maximum(counts, 1)
    pos = np.asarray(qs)[:, None] * (c - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, c - 1)
    big = np.flatnonzero(ok & (counts >= PARTITION_MIN))
    if len(big):
        lo_l, hi_l = lo[:, big].T.tolist(), hi[:, big].T.tolist()
        st_l, sl_l = starts[big].tolist(), seglen[big].tolist()
        for j, k in enumerate(big.tolist()):
            seg = g[st_l[j]:st_l[j] + sl_l[j]]
            kth = sorted(set(lo_l[j]) | set(hi_l[j]))
            seg.partition(kth)
            lo_v[:, k] = seg[lo_l[j]]
            hi_v[:, k] = seg[hi_l[j]]
    small = ok & (counts < PARTITION_MIN)
    if small.any():
        sidx = np.flatnonzero(small)
        sl = seglen[sidx]
        vals = g[np.repeat(small, seglen)]
        svals, sstarts, _ = _segments(np.repeat(np.arange(len(sidx)), sl), vals, len(sidx))
        lo_v[:, sidx] = svals[sstarts + lo[:, sidx]]
        hi_v[:, sidx] = svals[sstarts + hi[:, sidx]]
    return lo_v, hi_v


def _rank_offsets(iid, rid, nrg, rel_t, dur, whole):
    """Per (key, rank) group: sums of each timed record's enqueue and finish offsets from its
    instance's mean over the instance's timed records, over instances ``whole`` (seen timed on
    every rank), and their count. Offsets within an instance compare its ranks' clocks only."""
    ni = len(whole)
    ok = whole[iid] & ~np.isnan(dur)
    if not ok.any():
        z = np.zeros(nrg)
        return z, z, z
    i, r = iid[ok], rid[ok]
    start, end = rel_t[ok], rel_t[ok] + dur[ok]
    cnt = np.bincount(i, minlength=ni)
    with np.errstate(invalid="ignore", divide="ignore"):
        s_mean = np.bincount(i, weights=start, minlength=ni) / cnt
        e_mean = np.bincount(i, weights=end, minlength=ni) / cnt
    return (np.bincount(r, weights=start - s_mean[i], minlength=nrg),
            np.bincount(r, weights=end - e_mean[i], minlength=nrg),
            np.bincount(r, minlength=nrg).astype(np.float64))
