"""Window close, second part (:mod:`dynamiccl.collector.processors.aggregate`): the instances
(communicator, func, seqNumber) of a window's records and the per-(communicator, rank) rows:
latency, leave-one-out relative latency, shortest-duration votes, start skew and arrival/finish
offsets. Segment reductions only; nothing loops over records in Python."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dynamiccl.collector.processors.segments import _dense, _first_index, _quantile, _rank_offsets, _segments

if TYPE_CHECKING:
    from dynamiccl.collector.processors.aggregate import Keys

__all__ = ["Instances", "RankRows", "instances", "rank_rows"]


@dataclass
class Instances:
    iid: np.ndarray          # per record its instance
    first_i: np.ndarray      # each instance's first record
    n_all: np.ndarray        # records per instance
    n_t: np.ndarray          # timed records per instance
    s_t: np.ndarray          # sum of timed durations per instance
    at_min: np.ndarray       # records at their instance's shortest duration
    n_min: np.ndarray        # records at that minimum per instance
    start_mean: np.ndarray
    kid_i: np.ndarray        # each instance's key
    instances: np.ndarray    # per key: distinct instances
    spread_p50: np.ndarray   # per key: cross-rank spread over instances on >= 2 ranks
    spread_max: np.ndarray
    complete: np.ndarray     # per instance: every rank's record is here


@dataclass
class RankRows:
    """Per (communicator, rank) row of the window (``c_*``)."""
    records: np.ndarray
    lat: np.ndarray
    rel: np.ndarray
    skew: np.ndarray
    arr: np.ndarray
    fin: np.ndarray
    short: np.ndarray
    last: np.ndarray
    host: np.ndarray
    rank: np.ndarray
    gd: np.ndarray           # the row's window-local communicator
    comp_per_g: np.ndarray   # complete instances per communicator


def _instance_ids(gfid: np.ndarray, ngf: int, seq: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Dense instance ids, direct-addressed per (comm, func) ``gfid`` when the seqNumbers are compact
    enough, through a sort otherwise."""
    smin = np.full(ngf, np.iinfo(np.int64).max)
    smax = np.full(ngf, -1, np.int64)
    np.minimum.at(smin, gfid, seq)
    np.maximum.at(smax, gfid, seq)
    span = smax - smin + 1
    if n and int(span.sum()) <= 4 * n + 4096:
        off = np.zeros(ngf, np.int64)
        np.cumsum(span[:-1], out=off[1:])
        iid = (off - smin)[gfid] + seq
        n_all = np.bincount(iid, minlength=int(span.sum()))
        if not n_all.all():                    # gaps in the seqNumbers (sampling, losses): compact
            present = np.flatnonzero(n_all)
            lut = np.empty(len(n_all), np.int64)
            lut[present] = np.arange(len(present))
            iid, n_all = lut[iid], n_all[present]
        return iid, n_all
    iid, uinst = _dense((gfid << 40) | seq, limit=0)
    return iid, np.bincount(iid, minlength=len(uinst))


def instances(cols: dict[str, np.ndarray], k: "Keys") -> Instances:
    dur, seq, rel_t = cols["dur"], cols["seq"], cols["rel"]
    gfid_k, ugf = _dense((k.glk << 4) | k.func_k)
    iid, n_all = _instance_ids(gfid_k[k.kid], len(ugf), seq, len(k.kid))
    ni = len(n_all)
    first_i = _first_index(iid, ni)
    n_t = n_all - np.bincount(iid[k.untimed], minlength=ni) if len(k.untimed) else n_all
    s_t = np.bincount(iid, weights=k.dur0, minlength=ni)
    dmin = np.full(ni, np.inf)
    dmax = np.full(ni, -np.inf)
    np.fmin.at(dmin, iid, dur)
    np.fmax.at(dmax, iid, dur)
    dmin[n_t == 0] = np.nan
    dmax[n_t == 0] = np.nan
    at_min = np.flatnonzero(dur == dmin[iid])
    n_min = np.bincount(iid[at_min], minlength=ni)
    start_mean = np.bincount(iid, weights=rel_t, minlength=ni) / np.maximum(n_all, 1)
    kid_i = k.kid[first_i]
    multi = n_t >= 2
    svals, sstarts, scounts = _segments(kid_i[multi], (dmax - dmin)[multi], k.nk)
    spread_max = np.full(k.nk, np.nan)
    okk = scounts > 0
    spread_max[okk] = svals[sstarts[okk] + scounts[okk] - 1]
    return Instances(iid, first_i, n_all, n_t, s_t, at_min, n_min, start_mean, kid_i,
                     np.bincount(kid_i, minlength=k.nk), _quantile(svals, sstarts, scounts, 0.5), spread_max,
                     n_all >= cols["nranks"][first_i])


def rank_rows(cols: dict[str, np.ndarray], k: "Keys", inst: Instances) -> RankRows:
    """Per record → (key, rank) groups → (communicator, rank) rows."""
    kid, dur, rel_t, rank = k.kid, cols["dur"], cols["rel"], cols["rank"]
    n = len(kid)
    iid = inst.iid
    rmax = max(int(cols["nranks"].max()), int(rank.max()) + 1) if n else 1
    rid = kid * rmax + rank
    nrg = k.nk * rmax
    urid = None
    if nrg > (1 << 24):  # absurdly wide: compact through a sort
        urid, rid = np.unique(rid, return_inverse=True)
        nrg = len(urid)
    r_records = np.bincount(rid, minlength=nrg)
    r_timed = r_records - np.bincount(rid[k.untimed], minlength=nrg) if len(k.untimed) else r_records
    r_dsum = np.bincount(rid, weights=k.dur0, minlength=nrg)
    r_rel, r_rel_n = _relative(rid, nrg, iid, inst, dur)
    r_short = _shortest_votes(rid, nrg, inst)
    # start skew over records of instances seen on ≥ 2 ranks; a lone record's skew is exactly 0
    # (its instance's mean start is its own), so summing over every record changes nothing
    r_skew = np.bincount(rid, weights=rel_t - inst.start_mean[iid], minlength=nrg)
    r_skew_n = r_records - np.bincount(rid[inst.first_i[inst.n_all == 1]], minlength=nrg)
    r_arr, r_fin, r_off_n = _rank_offsets(iid, rid, nrg, rel_t, dur, inst.complete & (inst.n_t >= 2))
    r_last = np.full(nrg, -np.inf)
    np.maximum.at(r_last, rid, rel_t)
    r_host_k = np.zeros(nrg, np.int64)
    r_host_k[rid] = cols["host"]
    present_k = np.flatnonzero(r_records)
    pk = present_k if urid is None else urid[present_k]
    crid, ucr = _dense(k.glk[pk // rmax] * rmax + pk % rmax)
    ncr = len(ucr)

    def fold(x):
        return np.bincount(crid, weights=x[present_k], minlength=ncr)

    with np.errstate(invalid="ignore", divide="ignore"):
        c_lat = fold(r_dsum) / fold(r_timed)
        c_rel = fold(r_rel) / fold(r_rel_n)
        c_skew = fold(r_skew) / fold(r_skew_n)
        c_off_n = fold(r_off_n)
        c_arr, c_fin = fold(r_arr) / c_off_n, fold(r_fin) / c_off_n
    c_last = np.full(ncr, -np.inf)
    np.maximum.at(c_last, crid, r_last[present_k])
    c_host = np.zeros(ncr, np.int64)
    c_host[crid] = r_host_k[present_k]
    return RankRows(fold(r_records).round().astype(np.int64), c_lat, c_rel, c_skew, c_arr, c_fin,
                    fold(r_short).round().astype(np.int64), c_last, c_host, (ucr % rmax).astype(np.int32),
                    ucr // rmax, np.bincount(k.glk[inst.kid_i][inst.complete], minlength=len(k.ucodes)))


def _relative(rid, nrg, iid, inst: Instances, dur):
    """rel: a rank's duration / mean duration of the instance's other ranks (leave-one-out); its
    sum and count per (key, rank)."""
    nt_r = inst.n_t[iid]
    with np.errstate(invalid="ignore", divide="ignore"):
        others = (inst.s_t[iid] - dur) / (nt_r - 1)
        rel_ok = (nt_r >= 2) & (others > 0)
        rel = np.where(rel_ok, dur / others, 0.0)
    return np.bincount(rid, weights=rel, minlength=nrg), np.bincount(rid[rel_ok], minlength=nrg)


def _shortest_votes(rid, nrg, inst: Instances):
    """Per (key, rank) the instances where that rank alone took the shortest time. Only complete
    instances vote: a late rank's record falls into the next window, and the incomplete instance
    left behind would give its vote to one of the punctual peers."""
    at_min = inst.at_min
    im = inst.iid[at_min]
    shortest = at_min[(inst.n_t[im] >= 2) & (inst.n_min[im] == 1) & inst.complete[im]]
    return np.bincount(rid[shortest], minlength=nrg)
