"""What the demo keeps of every closed window: per stream, latency, bus bandwidth and the config that ran.

A *stream* is a communicator family × collective × size bucket (``dp AllReduce 16 MiB`` covers ``dp0`` …
``dp7``): the live view draws one sparkline per stream, and the summary measures the retuner's gain from the
per-config sums. Detected changes and config switches are kept as marks on the stream they touched. Bounded:
``max_windows`` points per stream, ``max_streams`` streams.

>>> import polars as pl
>>> from dynamiccl.collector.features import WindowFeatures, empty_ranks
>>> keys = pl.DataFrame({"comm_name": ["dp0", "dp1"], "func": ["AllReduce"] * 2, "size_bucket": [24, 24],
...                      "algo": ["RING"] * 2, "proto": ["SIMPLE"] * 2, "records": [10, 10], "instances": [5, 5],
...                      "lat_mean_s": [1e-3, 2e-3], "lat_p50_s": [1e-3, 2e-3], "busbw_Bps": [2e10, 1e10],
...                      "tuner_config_version": [0, 0]})
>>> h = History(epoch_s=100.0)
>>> h.add(WindowFeatures(105.0, 1.0, keys, empty_ranks()))
>>> s = h.streams[("dp", "AllReduce", 24)]
>>> s.t[-1], round(s.lat_s[-1] * 1e3, 2), s.cfg[-1], s.by_cfg[-1]["RING/SIMPLE"]
(5.0, 1.5, 'RING/SIMPLE', (0.015, 10))
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

__all__ = ["History", "Stream", "family"]

_DIGITS = re.compile(r"\d+$")


def family(comm_name: str) -> str:
    """``dp7`` -> ``dp``: the communicators a workload group creates share a family."""
    return _DIGITS.sub("", comm_name or "?") or comm_name


@dataclass
class Stream:
    """Per closed window (oldest first): window start (s since the job's epoch), median p50 latency and bus
    bandwidth over the family's communicators, the config most records ran, the newest applied tuner config
    version seen, and per config ``(sum of latency × instances, instances)``."""
    t: deque = field(default_factory=deque)
    lat_s: deque = field(default_factory=deque)
    busbw: deque = field(default_factory=deque)
    cfg: deque = field(default_factory=deque)
    version: deque = field(default_factory=deque)
    by_cfg: deque = field(default_factory=deque)
    busy_s: float = 0.0            # collective time seen (sum of latency × instances): ranks the streams
    changes: list = field(default_factory=list)    # (detected s, onset s, kind)
    switches: list = field(default_factory=list)   # (window s, from config, to config, version)

    def trim(self, n: int) -> None:
        for d in (self.t, self.lat_s, self.busbw, self.cfg, self.version, self.by_cfg):
            while len(d) > n:
                d.popleft()


class History:
    def __init__(self, epoch_s: float, max_windows: int = 900, max_streams: int = 64) -> None:
        self.epoch_s = epoch_s
        self.max_windows = max_windows
        self.max_streams = max_streams
        self.streams: dict[tuple[str, str, int], Stream] = {}
        self.dropped_streams = 0       # streams not kept (over max_streams), counted

    def add(self, wf) -> None:
        import polars as pl

        keys = wf.keys
        if keys.height == 0:
            return
        t = wf.window_start - self.epoch_s
        df = keys.with_columns(pl.col("comm_name").map_elements(family, return_dtype=pl.String).alias("family"),
                               (pl.col("algo") + "/" + pl.col("proto")).alias("cfg"),
                               (pl.col("lat_mean_s").fill_null(0.0) * pl.col("instances")).alias("busy"))
        per_cfg = (df.group_by("family", "func", "size_bucket", "cfg")
                   .agg(pl.col("busy").sum(), pl.col("instances").sum(), pl.col("records").sum(),
                        pl.col("tuner_config_version").max()))
        per_stream = (df.group_by("family", "func", "size_bucket")
                      .agg(pl.col("lat_p50_s").median(), pl.col("busbw_Bps").median()))
        cfgs: dict[tuple, list] = {}
        for r in per_cfg.iter_rows(named=True):
            cfgs.setdefault((r["family"], r["func"], r["size_bucket"]), []).append(r)
        for r in per_stream.iter_rows(named=True):
            key = (r["family"], r["func"], int(r["size_bucket"]))
            s = self.streams.get(key)
            if s is None:
                if len(self.streams) >= self.max_streams:
                    self.dropped_streams += 1
                    continue
                s = self.streams[key] = Stream()
            rows = cfgs.get((r["family"], r["func"], r["size_bucket"]), [])
            main = max(rows, key=lambda x: x["records"])["cfg"] if rows else "?"
            version = max((int(x["tuner_config_version"] or 0) for x in rows), default=0)
            if s.cfg and main != s.cfg[-1]:
                s.switches.append((t, s.cfg[-1], main, version))
            s.t.append(t)
            s.lat_s.append(r["lat_p50_s"])
            s.busbw.append(r["busbw_Bps"])
            s.cfg.append(main)
            s.version.append(version)
            s.by_cfg.append({x["cfg"]: (float(x["busy"]), int(x["instances"])) for x in rows})
            s.busy_s += sum(float(x["busy"]) for x in rows)
            s.trim(self.max_windows)

    def mark_change(self, change) -> None:
        """Attach a detected change to every stream of the communicators (and size buckets) it names."""
        fams = {family(n) for n in (change.comm_names or ())}
        buckets = set(change.size_buckets or ())
        for (fam, _func, bucket), s in self.streams.items():
            if fam in fams and (not buckets or bucket in buckets):
                s.changes.append((change.detected_s - self.epoch_s, change.start_s - self.epoch_s, change.kind))

    def top(self, n: int) -> list[tuple[tuple[str, str, int], Stream]]:
        """The ``n`` streams that carried the most collective time."""
        return sorted(self.streams.items(), key=lambda kv: -kv[1].busy_s)[:n]
