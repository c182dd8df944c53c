"""Window close, last part (:mod:`dynamiccl.collector.processors.aggregate`): the ``keys`` and
``ranks`` frames of `WindowFeatures`, and the exporter-only frames (histograms per (key, host), each
rank's last event, start skew)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from dynamiccl.collector.component import WindowResult
from dynamiccl.collector.features import KEYS_SCHEMA, RANKS_SCHEMA, WindowFeatures
from dynamiccl.collector.metrics import DURATION_BUCKETS_S
from dynamiccl.collector.processors.segments import _dense, _nan_to_null
from dynamiccl.collector.records import busbw_factor
from dynamiccl.collector.wire_format import ALGOS, FUNCS, PROTOS

if TYPE_CHECKING:
    from dynamiccl.collector.processors.aggregate import Keys, KeyStats
    from dynamiccl.collector.processors.aggregate_ranks import Instances, RankRows
    from dynamiccl.collector.processors.window_agg import WindowAggregator

__all__ = ["window_result", "N_BUCKETS"]

N_BUCKETS = len(DURATION_BUCKETS_S) + 1  # + overflow (+Inf)
_FUNC_NAMES = np.array(list(FUNCS) + ["UNKNOWN"] * (16 - len(FUNCS)), dtype=object)
_ALGO_NAMES = np.array([ALGOS[i] if i < len(ALGOS) else "UNKNOWN" for i in range(256)], dtype=object)
_PROTO_NAMES = np.array([PROTOS[i] if i < len(PROTOS) else "UNKNOWN" for i in range(256)], dtype=object)


def window_result(cols: dict[str, np.ndarray], k: "Keys", ks: "KeyStats", inst: "Instances", rr: "RankRows", *,
                  window_start_ns: int, window_s: float, aggregator: "WindowAggregator") -> WindowResult:
    jobs, hashes, names = aggregator.gcomm_table(k.ucodes)
    jobs_a = np.array(jobs, dtype=object)
    host_names = np.array(aggregator.hosts.values, dtype=object)
    keys_df = _keys_frame(cols, k, ks, inst, jobs_a, np.array(names, dtype=object), hashes)
    r_job = jobs_a[rr.gd].tolist()
    r_hostname = host_names[rr.host].tolist()
    ranks_df = pl.DataFrame({
        "job_id": r_job, "comm_hash": hashes[rr.gd], "rank": rr.rank,
        "host": r_hostname, "records": rr.records,
        "lat_mean_s": _nan_to_null(rr.lat), "rel_lat_mean": _nan_to_null(rr.rel),
        "shortest_count": rr.short, "instances_complete": rr.comp_per_g[rr.gd].astype(np.int64),
    }, schema=RANKS_SCHEMA).with_columns(_nan_to_null(rr.arr).alias("arr_off_s"),
                                         _nan_to_null(rr.fin).alias("fin_off_s"))
    comm_label = np.array([nm or f"{h:016x}" for nm, h in zip(names, hashes.tolist())], dtype=object)
    hist = _histograms(cols, k, jobs_a, host_names, comm_label)
    last_ns = window_start_ns + np.round(rr.last * 1e9).astype(np.int64)
    last_event = pl.DataFrame({
        "job_id": r_job, "host": r_hostname, "rank": rr.rank,
        "last_event_s": last_ns.astype(np.float64) * 1e-9,
    })
    skew_df = pl.DataFrame({
        "job_id": r_job, "comm": comm_label[rr.gd].tolist(),
        "rank": rr.rank, "skew_s": _nan_to_null(rr.skew),
    })
    features = WindowFeatures(window_start_ns / 1e9, window_s, keys_df, ranks_df, {})
    return WindowResult(features=features, histograms=hist, last_event=last_event, skew=skew_df,
                        wholly_untimed=(inst.n_t == 0)[inst.iid] if len(k.untimed) else None)


def _keys_frame(cols, k: "Keys", ks: "KeyStats", inst: "Instances", jobs_a, names_a, hashes) -> pl.DataFrame:
    nk, pos_k = k.nk, k.glk
    with np.errstate(invalid="ignore", divide="ignore"):
        lat_mean = k.dsum / k.dcounts
        busbw = ks.algbw_med * busbw_factor(k.func_k, ks.nranks_k)
    return pl.DataFrame({
        "job_id": jobs_a[pos_k].tolist() if nk else [], "comm_name": names_a[pos_k].tolist() if nk else [],
        "func": _FUNC_NAMES[k.func_k].tolist(), "algo": _ALGO_NAMES[k.algo_k].tolist(),
        "proto": _PROTO_NAMES[k.proto_k].tolist(), "comm_hash": hashes[pos_k],
        "size_bucket": k.sb_k, "nranks": ks.nranks_k.astype(np.int32),
        "nnodes": cols["nnodes"][ks.first_k].astype(np.int32), "records": k.records.astype(np.int64),
        "instances": inst.instances.astype(np.int64), "bytes_total": k.bytes_f.round().astype(np.int64),
        "lat_mean_s": _nan_to_null(lat_mean), "lat_p50_s": _nan_to_null(ks.p50),
        "lat_p90_s": _nan_to_null(ks.p90), "lat_p99_s": _nan_to_null(ks.p99),
        "lat_max_s": _nan_to_null(ks.lat_max), "algbw_Bps": _nan_to_null(ks.algbw_med),
        "busbw_Bps": _nan_to_null(busbw), "spread_p50_s": _nan_to_null(inst.spread_p50),
        "spread_max_s": _nan_to_null(inst.spread_max), "tuner_config_version": k.tcv_k,
    }, schema=KEYS_SCHEMA)


def _histograms(cols, k: "Keys", jobs_a, host_names, comm_label) -> dict:
    """Exporter-only: duration histograms per (key, host), with their sums, records and bytes."""
    kid, nk = k.kid, k.nk
    hl, uhost = _dense(cols["host"])
    nh = len(uhost)
    nb1 = N_BUCKETS + 1                       # + the untimed slot, dropped below
    if nh <= 1:
        khid, nkh = kid, nk
        kid_of_kh = np.arange(nk)
        host_of_kh = np.full(nk, uhost[0] if nh else 0)
        h_records, h_bytes, hsum = k.records, k.bytes_f, k.dsum
    else:
        khid, ukh = _dense(kid * nh + hl)
        nkh = len(ukh)
        kid_of_kh = ukh // nh
        host_of_kh = uhost[ukh % nh]
        h_records = np.bincount(khid, minlength=nkh)
        h_bytes = np.bincount(khid, weights=cols["bytes"], minlength=nkh)
        hsum = np.bincount(khid, weights=k.dur0, minlength=nkh)
    hcounts = np.bincount(khid * nb1 + cols["bucket"], minlength=nkh * nb1).reshape(nkh, nb1)[:, :N_BUCKETS]
    kpos = k.glk[kid_of_kh]
    return {
        "job_id": jobs_a[kpos], "host": host_names[host_of_kh],
        "comm": comm_label[kpos], "func": _FUNC_NAMES[k.func_k[kid_of_kh]],
        "algo": _ALGO_NAMES[k.algo_k[kid_of_kh]], "proto": _PROTO_NAMES[k.proto_k[kid_of_kh]],
        "size_bucket": k.sb_k[kid_of_kh], "counts": hcounts, "sum_s": hsum,
        "records": h_records, "bytes": h_bytes,
    }
