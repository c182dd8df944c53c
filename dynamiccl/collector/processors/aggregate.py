"""Window close: one window's per-record columns → the ``keys`` and ``ranks`` tables (and the exporter's
histograms). Dense ids through bincount lookup tables, bincount / ufunc.at segment reductions, one radix
argsort for quantiles, np.partition only for keys with many records; nothing loops over records in Python.
The hot path that fills the columns is :mod:`dynamiccl.collector.processors.window_agg`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from dynamiccl.collector.component import WindowResult
from dynamiccl.collector.features import KEYS_SCHEMA, RANKS_SCHEMA, WindowFeatures
from dynamiccl.collector.metrics import DURATION_BUCKETS_S, SelfMetrics
from dynamiccl.collector.records import busbw_factor
from dynamiccl.collector.processors.segments import (
    _dense, _first_index, _key_ids, _nan_to_null, _order_stats, _quantile, _rank_offsets, _segments,
)
from dynamiccl.collector.wire_format import ALGOS, FUNCS, PROTOS

if TYPE_CHECKING:
    from dynamiccl.collector.processors.window_agg import WindowAggregator

_U = np.uint64
_MAX_GCOMM = 1 << 20
_M40 = _U((1 << 40) - 1)
_BOUNDS = np.asarray(DURATION_BUCKETS_S)
N_BUCKETS = len(_BOUNDS) + 1  # + overflow (+Inf)
_FUNC_NAMES = np.array(list(FUNCS) + ["UNKNOWN"] * (16 - len(FUNCS)), dtype=object)
_ALGO_NAMES = np.array([ALGOS[i] if i < len(ALGOS) else "UNKNOWN" for i in range(256)], dtype=object)
_PROTO_NAMES = np.array([PROTOS[i] if i < len(PROTOS) else "UNKNOWN" for i in range(256)], dtype=object)
# per func code: key low bits (func<<12) and whether traffic = bytes × nranks (AllGather/ReduceScatter)
_FUNC_BITS = (np.arange(256, dtype=np.int64) & 0xF) << 12
_ALGO_BITS = np.minimum(np.arange(256, dtype=np.int64), 7) << 9
_PROTO_BITS = np.minimum(np.arange(256, dtype=np.int64), 3) << 7
_TIMES_NRANKS = np.zeros(16, bool)
_TIMES_NRANKS[[FUNCS.index("AllGather"), FUNCS.index("ReduceScatter")]] = True


def _counters(m: SelfMetrics, n: int) -> dict:
    snap = m.snapshot()
    out = {"records": n}
    for k, v in snap.items():
        if isinstance(v, dict):
            for reason, count in v.items():
                out[f"{k}:{reason}"] = count
        else:
            out[k] = v
    return out


def aggregate_window(cols: dict[str, np.ndarray], *, window_start_ns: int, window_s: float,
                     aggregator: "WindowAggregator") -> WindowResult:
    kc, dur, seq, rel_t = cols["kc"], cols["dur"], cols["seq"], cols["rel"]
    n = len(kc)
    # ---- keys: dense ids, counts, sums ----------------------------------------------------------
    kid, ukc = _key_ids(kc)
    nk = len(ukc)
    glk, ucodes = _dense(ukc >> 16)            # window-local communicator index per key
    low = ukc & 0xFFFF
    func_k = low >> 12
    algo_k = (low >> 9) & 0x7
    algo_k[algo_k == 7] = 255
    proto_k = (low >> 7) & 0x3
    proto_k[proto_k == 3] = 255
    sb_k = (low & 0x7F).astype(np.int32) - 1
    records = np.bincount(kid, minlength=nk)
    bytes_f = np.bincount(kid, weights=cols["bytes"], minlength=nk)
    bytes_total = bytes_f.round().astype(np.int64)
    nan = np.isnan(dur)
    untimed = np.flatnonzero(nan)
    dur0 = np.where(nan, 0.0, dur) if len(untimed) else dur
    del nan
    dcounts = records - np.bincount(kid[untimed], minlength=nk) if len(untimed) else records
    dsum = np.bincount(kid, weights=dur0, minlength=nk)
    with np.errstate(invalid="ignore", divide="ignore"):
        lat_mean = dsum / dcounts
    tcv = cols["tcv"]
    tcv_k = np.zeros(nk, np.uint32)            # applied tuner-config version: max over the key's records
    if tcv.any():
        np.maximum.at(tcv_k, kid, tcv)
    # ---- latency quantiles and bandwidth median, per key -----------------------------------------
    kstarts = np.zeros(nk, np.int64)
    if nk > 1:
        np.cumsum(records[:-1], out=kstarts[1:])
    order = np.argsort(kid.astype(np.uint16) if nk <= (1 << 16) else kid, kind="stable")
    first_k = order[kstarts]                   # stable: the key's first record
    nranks_k = cols["nranks"][first_k]
    g = dur[order]
    lat_max = np.fmax.reduceat(g, kstarts) if nk else np.zeros(0)   # NaN-ignoring max per key
    lat_max[dcounts == 0] = np.nan
    zero = np.flatnonzero(dur == 0)
    nzero = np.bincount(kid[zero], minlength=nk)
    b0 = cols["bytes"][first_k]                # records whose size differs from the key's first one
    nb_diff = np.bincount(kid[np.flatnonzero(cols["bytes"] != b0[kid])], minlength=nk)
    (d50, d90, d99), (e50, e90, e99) = _order_stats(g, kstarts, records, dcounts, (0.5, 0.9, 0.99))
    del g

    def interp(q, a, b):
        pos = q * (np.maximum(dcounts, 1) - 1)
        return a + (b - a) * (pos - np.floor(pos))

    p50, p90, p99 = interp(0.5, d50, e50), interp(0.9, d90, e90), interp(0.99, d99, e99)
    # traffic (nccl-tests "S") per record = bytes × (nranks for AllGather/ReduceScatter); keys where
    # every record moves the same traffic and none took 0 s: the median bandwidth is traffic over
    # the two middle durations. Other keys: bandwidths grouped and selected like the durations.
    tfac = np.where(_TIMES_NRANKS[func_k], nranks_k, 1).astype(np.float64)
    bw_n = dcounts - nzero
    uni = (nb_diff == 0) & (nzero == 0) & (dcounts > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mid_hi = np.where(dcounts % 2 == 1, d50, e50)   # the two middle elements: (c−1)//2, c//2
        algbw_med = 0.5 * (b0 * tfac / d50 + b0 * tfac / mid_hi)
    algbw_med[~uni] = np.nan
    mixed = ~uni & (bw_n > 0)
    if mixed.any():
        sel = order[np.repeat(mixed, records)]  # the mixed keys' records, grouped by key
        ks = kid[sel]
        with np.errstate(invalid="ignore", divide="ignore"):
            ds = dur[sel]
            bw = np.where(ds > 0, cols["bytes"][sel] * tfac[ks] / ds, np.nan)
        mstarts = np.zeros(nk, np.int64)
        mlen = np.where(mixed, records, 0)
        np.cumsum(mlen[:-1], out=mstarts[1:])
        (b_lo,), (b_hi,) = _order_stats(bw, mstarts, mlen, np.where(mixed, bw_n, 0), (0.5,))
        odd = (bw_n % 2 == 1)[mixed]
        algbw_med[mixed] = np.where(odd, b_lo[mixed], 0.5 * (b_lo[mixed] + b_hi[mixed]))
    del order
    # ---- instances: (communicator, func, seqNumber), direct-addressed per (comm, func) ---------
    gfid_k, ugf = _dense((glk << 4) | func_k)
    ngf = len(ugf)
    gfid = gfid_k[kid]
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
    else:
        iid, uinst = _dense((gfid << 40) | seq, limit=0)
        n_all = np.bincount(iid, minlength=len(uinst))
    del gfid
    ni = len(n_all)
    first_i = _first_index(iid, ni)
    n_t = n_all - np.bincount(iid[untimed], minlength=ni) if len(untimed) else n_all
    s_t = np.bincount(iid, weights=dur0, minlength=ni)
    dmin = np.full(ni, np.inf)
    dmax = np.full(ni, -np.inf)
    np.fmin.at(dmin, iid, dur)
    np.fmax.at(dmax, iid, dur)
    dmin[n_t == 0] = np.nan
    dmax[n_t == 0] = np.nan
    at_min = np.flatnonzero(dur == dmin[iid])
    n_min = np.bincount(iid[at_min], minlength=ni)
    start_mean = np.bincount(iid, weights=rel_t, minlength=ni) / np.maximum(n_all, 1)
    kid_i = kid[first_i]
    # per key: instances (distinct seq numbers) and cross-rank spread over instances on ≥ 2 ranks
    instances = np.bincount(kid_i, minlength=nk)
    multi = n_t >= 2
    svals, sstarts, scounts = _segments(kid_i[multi], (dmax - dmin)[multi], nk)
    spread_p50 = _quantile(svals, sstarts, scounts, 0.5)
    spread_max = np.full(nk, np.nan)
    okk = scounts > 0
    spread_max[okk] = svals[sstarts[okk] + scounts[okk] - 1]
    complete = n_all >= cols["nranks"][first_i]
    # ---- per record → (key, rank) groups → (communicator, rank) rows ------------------------------
    rank = cols["rank"]
    rmax = max(int(cols["nranks"].max()), int(rank.max()) + 1) if n else 1
    rid = kid * rmax + rank
    nrg = nk * rmax
    if nrg > (1 << 24):  # absurdly wide: compact through a sort
        urid, rid = np.unique(rid, return_inverse=True)
        nrg = len(urid)
    else:
        urid = None
    r_records = np.bincount(rid, minlength=nrg)
    r_timed = r_records - np.bincount(rid[untimed], minlength=nrg) if len(untimed) else r_records
    r_dsum = np.bincount(rid, weights=dur0, minlength=nrg)
    # rel: this rank's duration / mean duration of the instance's other ranks (leave-one-out)
    nt_r = n_t[iid]
    with np.errstate(invalid="ignore", divide="ignore"):
        others = (s_t[iid] - dur) / (nt_r - 1)
        rel_ok = (nt_r >= 2) & (others > 0)
        rel = np.where(rel_ok, dur / others, 0.0)
    r_rel = np.bincount(rid, weights=rel, minlength=nrg)
    r_rel_n = np.bincount(rid[rel_ok], minlength=nrg)
    del others, rel, rel_ok
    im = iid[at_min]
    # only complete instances vote: a late rank's record falls into the next window, and the
    # incomplete instance left behind would give its vote to one of the punctual peers
    shortest = at_min[(nt_r[at_min] >= 2) & (n_min[im] == 1) & complete[im]]
    r_short = np.bincount(rid[shortest], minlength=nrg)
    del nt_r
    # start skew over records of instances seen on ≥ 2 ranks; a lone record's skew is exactly 0
    # (its instance's mean start is its own), so summing over every record changes nothing
    r_skew = np.bincount(rid, weights=rel_t - start_mean[iid], minlength=nrg)
    r_skew_n = r_records - np.bincount(rid[first_i[n_all == 1]], minlength=nrg)
    r_arr, r_fin, r_off_n = _rank_offsets(iid, rid, nrg, rel_t, dur, complete & (n_t >= 2))
    r_last = np.full(nrg, -np.inf)
    np.maximum.at(r_last, rid, rel_t)
    r_host_k = np.zeros(nrg, np.int64)
    r_host_k[rid] = cols["host"]
    present_k = np.flatnonzero(r_records)
    pk = present_k if urid is None else urid[present_k]
    crid, ucr = _dense(glk[pk // rmax] * rmax + pk % rmax)
    ncr = len(ucr)

    def fold(x):
        return np.bincount(crid, weights=x[present_k], minlength=ncr)

    c_records = fold(r_records).round().astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        c_lat = fold(r_dsum) / fold(r_timed)
        c_rel = fold(r_rel) / fold(r_rel_n)
        c_skew = fold(r_skew) / fold(r_skew_n)
        c_off_n = fold(r_off_n)
        c_arr, c_fin = fold(r_arr) / c_off_n, fold(r_fin) / c_off_n
    c_short = fold(r_short).round().astype(np.int64)
    c_last = np.full(ncr, -np.inf)
    np.maximum.at(c_last, crid, r_last[present_k])
    c_host = np.zeros(ncr, np.int64)
    c_host[crid] = r_host_k[present_k]
    c_rank = (ucr % rmax).astype(np.int32)
    c_gd = ucr // rmax
    comp_per_g = np.bincount(glk[kid_i][complete], minlength=len(ucodes))
    # ---- strings -------------------------------------------------------------------------------------
    jobs, hashes, names = aggregator.gcomm_table(ucodes)
    pos_k = glk
    jobs_a = np.array(jobs, dtype=object)
    names_a = np.array(names, dtype=object)
    host_names = np.array(aggregator.hosts.values, dtype=object)
    with np.errstate(invalid="ignore", divide="ignore"):
        busbw = algbw_med * busbw_factor(func_k, nranks_k)
    keys_df = pl.DataFrame({
        "job_id": jobs_a[pos_k].tolist() if nk else [], "comm_name": names_a[pos_k].tolist() if nk else [],
        "func": _FUNC_NAMES[func_k].tolist(), "algo": _ALGO_NAMES[algo_k].tolist(),
        "proto": _PROTO_NAMES[proto_k].tolist(), "comm_hash": hashes[pos_k],
        "size_bucket": sb_k, "nranks": nranks_k.astype(np.int32),
        "nnodes": cols["nnodes"][first_k].astype(np.int32), "records": records.astype(np.int64),
        "instances": instances.astype(np.int64), "bytes_total": bytes_total,
        "lat_mean_s": _nan_to_null(lat_mean), "lat_p50_s": _nan_to_null(p50),
        "lat_p90_s": _nan_to_null(p90), "lat_p99_s": _nan_to_null(p99),
        "lat_max_s": _nan_to_null(lat_max), "algbw_Bps": _nan_to_null(algbw_med),
        "busbw_Bps": _nan_to_null(busbw), "spread_p50_s": _nan_to_null(spread_p50),
        "spread_max_s": _nan_to_null(spread_max), "tuner_config_version": tcv_k,
    }, schema=KEYS_SCHEMA)
    r_job = jobs_a[c_gd].tolist()
    r_hostname = host_names[c_host].tolist()
    ranks_df = pl.DataFrame({
        "job_id": r_job, "comm_hash": hashes[c_gd], "rank": c_rank,
        "host": r_hostname, "records": c_records,
        "lat_mean_s": _nan_to_null(c_lat), "rel_lat_mean": _nan_to_null(c_rel),
        "shortest_count": c_short, "instances_complete": comp_per_g[c_gd].astype(np.int64),
    }, schema=RANKS_SCHEMA).with_columns(_nan_to_null(c_arr).alias("arr_off_s"),
                                         _nan_to_null(c_fin).alias("fin_off_s"))
    # ---- exporter-only frames: histograms per (key, host) ------------------------------------------
    comm_label = np.array([nm or f"{h:016x}" for nm, h in zip(names, hashes.tolist())], dtype=object)
    host = cols["host"]
    hl, uhost = _dense(host)
    nh = len(uhost)
    nb1 = N_BUCKETS + 1                       # + the untimed slot, dropped below
    if nh <= 1:
        khid, nkh = kid, nk
        kid_of_kh = np.arange(nk)
        host_of_kh = np.full(nk, uhost[0] if nh else 0)
        h_records, h_bytes, hsum = records, bytes_f, dsum
    else:
        khid, ukh = _dense(kid * nh + hl)
        nkh = len(ukh)
        kid_of_kh = ukh // nh
        host_of_kh = uhost[ukh % nh]
        h_records = np.bincount(khid, minlength=nkh)
        h_bytes = np.bincount(khid, weights=cols["bytes"], minlength=nkh)
        hsum = np.bincount(khid, weights=dur0, minlength=nkh)
    hcounts = np.bincount(khid * nb1 + cols["bucket"], minlength=nkh * nb1).reshape(nkh, nb1)[:, :N_BUCKETS]
    kpos = glk[kid_of_kh]
    hist = {
        "job_id": jobs_a[kpos], "host": host_names[host_of_kh],
        "comm": comm_label[kpos], "func": _FUNC_NAMES[func_k[kid_of_kh]],
        "algo": _ALGO_NAMES[algo_k[kid_of_kh]], "proto": _PROTO_NAMES[proto_k[kid_of_kh]],
        "size_bucket": sb_k[kid_of_kh], "counts": hcounts, "sum_s": hsum,
        "records": h_records, "bytes": h_bytes,
    }
    last_ns = window_start_ns + np.round(c_last * 1e9).astype(np.int64)
    last_event = pl.DataFrame({
        "job_id": r_job, "host": r_hostname, "rank": c_rank,
        "last_event_s": last_ns.astype(np.float64) * 1e-9,
    })
    skew_df = pl.DataFrame({
        "job_id": r_job, "comm": comm_label[c_gd].tolist(),
        "rank": c_rank, "skew_s": _nan_to_null(c_skew),
    })
    features = WindowFeatures(window_start_ns / 1e9, window_s, keys_df, ranks_df, {})
    return WindowResult(features=features, histograms=hist, last_event=last_event, skew=skew_df,
                        wholly_untimed=(n_t == 0)[iid] if len(untimed) else None)
