"""Window close: one window's per-record columns → the ``keys`` and ``ranks`` tables (and the exporter's
histograms). Dense ids through bincount lookup tables, bincount / ufunc.at segment reductions, one radix
argsort for quantiles, np.partition only for keys with many records; nothing loops over records in Python.
The hot path that fills the columns is :mod:`dynamiccl.collector.processors.window_agg`.

Phases, one function each: the keys (`_keys`), their latency quantiles and median bandwidth
(`_key_stats`), the instances and the per-rank rows (`aggregate_ranks`), the frames and the exporter's
histograms (`aggregate_frames`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dynamiccl.collector.component import WindowResult
from dynamiccl.collector.metrics import DURATION_BUCKETS_S, SelfMetrics
from dynamiccl.collector.processors.aggregate_frames import N_BUCKETS, window_result
from dynamiccl.collector.processors.aggregate_ranks import instances, rank_rows
from dynamiccl.collector.processors.segments import _dense, _key_ids, _order_stats
from dynamiccl.collector.wire_format import FUNCS

if TYPE_CHECKING:
    from dynamiccl.collector.processors.window_agg import WindowAggregator

__all__ = ["aggregate_window", "Keys", "KeyStats", "N_BUCKETS"]

_U = np.uint64
_MAX_GCOMM = 1 << 20
_M40 = _U((1 << 40) - 1)
_BOUNDS = np.asarray(DURATION_BUCKETS_S)
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


@dataclass
class Keys:
    """Per record its key id (``kid``) and per key (algo, proto, size bucket, func) its sums."""
    kid: np.ndarray
    nk: int
    glk: np.ndarray          # window-local communicator index per key
    ucodes: np.ndarray       # the communicators' global codes
    func_k: np.ndarray
    algo_k: np.ndarray
    proto_k: np.ndarray
    sb_k: np.ndarray
    records: np.ndarray
    bytes_f: np.ndarray
    untimed: np.ndarray      # indices of untimed records
    dur0: np.ndarray         # durations with untimed ones as 0
    dcounts: np.ndarray      # timed records per key
    dsum: np.ndarray
    tcv_k: np.ndarray        # applied tuner-config version: max over the key's records


@dataclass
class KeyStats:
    first_k: np.ndarray      # each key's first record
    nranks_k: np.ndarray
    lat_max: np.ndarray
    p50: np.ndarray
    p90: np.ndarray
    p99: np.ndarray
    algbw_med: np.ndarray


def _keys(cols: dict[str, np.ndarray]) -> Keys:
    kid, ukc = _key_ids(cols["kc"])
    nk = len(ukc)
    glk, ucodes = _dense(ukc >> 16)
    low = ukc & 0xFFFF
    algo_k = (low >> 9) & 0x7
    algo_k[algo_k == 7] = 255
    proto_k = (low >> 7) & 0x3
    proto_k[proto_k == 3] = 255
    records = np.bincount(kid, minlength=nk)
    dur = cols["dur"]
    nan = np.isnan(dur)
    untimed = np.flatnonzero(nan)
    dur0 = np.where(nan, 0.0, dur) if len(untimed) else dur
    dcounts = records - np.bincount(kid[untimed], minlength=nk) if len(untimed) else records
    tcv = cols["tcv"]
    tcv_k = np.zeros(nk, np.uint32)
    if tcv.any():
        np.maximum.at(tcv_k, kid, tcv)
    return Keys(kid, nk, glk, ucodes, low >> 12, algo_k, proto_k, (low & 0x7F).astype(np.int32) - 1, records,
                np.bincount(kid, weights=cols["bytes"], minlength=nk), untimed, dur0, dcounts,
                np.bincount(kid, weights=dur0, minlength=nk), tcv_k)


def _key_stats(cols: dict[str, np.ndarray], k: Keys) -> KeyStats:
    """Latency quantiles, max and median bandwidth per key (one sort of the records by key)."""
    kid, nk, dur, records, dcounts = k.kid, k.nk, cols["dur"], k.records, k.dcounts
    kstarts = np.zeros(nk, np.int64)
    if nk > 1:
        np.cumsum(records[:-1], out=kstarts[1:])
    order = np.argsort(kid.astype(np.uint16) if nk <= (1 << 16) else kid, kind="stable")
    first_k = order[kstarts]                   # stable: the key's first record
    nranks_k = cols["nranks"][first_k]
    g = dur[order]
    lat_max = np.fmax.reduceat(g, kstarts) if nk else np.zeros(0)   # NaN-ignoring max per key
    lat_max[dcounts == 0] = np.nan
    (d50, d90, d99), (e50, e90, e99) = _order_stats(g, kstarts, records, dcounts, (0.5, 0.9, 0.99))
    del g

    def interp(q, a, b):
        pos = q * (np.maximum(dcounts, 1) - 1)
        return a + (b - a) * (pos - np.floor(pos))

    algbw_med = _median_bandwidth(cols, k, order, first_k, nranks_k, d50, e50)
    return KeyStats(first_k, nranks_k, lat_max, interp(0.5, d50, e50), interp(0.9, d90, e90),
                    interp(0.99, d99, e99), algbw_med)


def _median_bandwidth(cols, k: Keys, order, first_k, nranks_k, d50, e50) -> np.ndarray:
    """Traffic (nccl-tests "S") per record = bytes × (nranks for AllGather/ReduceScatter); keys where
    every record moves the same traffic and none took 0 s: the median bandwidth is traffic over
    the two middle durations. Other keys: bandwidths grouped and selected like the durations."""
    kid, nk, dur, records, dcounts = k.kid, k.nk, cols["dur"], k.records, k.dcounts
    nzero = np.bincount(kid[np.flatnonzero(dur == 0)], minlength=nk)
    b0 = cols["bytes"][first_k]                # records whose size differs from the key's first one
    nb_diff = np.bincount(kid[np.flatnonzero(cols["bytes"] != b0[kid])], minlength=nk)
    tfac = np.where(_TIMES_NRANKS[k.func_k], nranks_k, 1).astype(np.float64)
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
    return algbw_med


def aggregate_window(cols: dict[str, np.ndarray], *, window_start_ns: int, window_s: float,
                     aggregator: "WindowAggregator") -> WindowResult:
    k = _keys(cols)
    ks = _key_stats(cols, k)
    inst = instances(cols, k)
    rr = rank_rows(cols, k, inst)
    return window_result(cols, k, ks, inst, rr, window_start_ns=window_start_ns, window_s=window_s,
                         aggregator=aggregator)
