"""The detector replay runs: ``detector.service.Detector`` when it exists, else a small interim one.

Both take a ``detector.config.DetectorConfig`` and expose ``process(wf) -> list[RegimeChange]``
(the contract in ``dynamiccl/detector/events.py``), so ``dynamiccl replay`` has one set of settings.

The interim detector (:class:`InterimDetector`) is what the demo watched with, on the real
contract: one ``CUSUMBank`` per configured delta over ``log(lat_p50_s)`` of every (job,
communicator, collective, size bucket) stream; alarms of one job within ``merge_s`` of its last
change join it; an upward alarm is a ``bandwidth`` change when a stream of ≥ 64 KiB messages
fired, else ``latency``; a downward alarm on a stream of an active change is its ``recovery``.
No classification of stragglers or flapping, no localisation beyond the streams that fired.

>>> import numpy as np, polars as pl
>>> from dynamiccl.collector.features import KEYS_SCHEMA, WindowFeatures, empty_ranks
>>> det = InterimDetector(DetectorConfig(warmup=20, arl0=1e4, deltas=(3.0,), autoencoder=False))
>>> rng = np.random.default_rng(0)
>>> def window(t, lat):
...     keys = pl.DataFrame({"job_id": ["j"], "comm_name": ["dp"], "func": ["AllReduce"], "algo": ["RING"],
...         "proto": ["SIMPLE"], "comm_hash": [31], "size_bucket": [24], "nranks": [2], "nnodes": [2],
...         "records": [20], "instances": [10], "bytes_total": [20 << 24], "lat_mean_s": [lat],
...         "lat_p50_s": [lat], "lat_p90_s": [lat], "lat_p99_s": [lat], "lat_max_s": [lat], "algbw_Bps": [1e9],
...         "busbw_Bps": [1e9], "spread_p50_s": [0.0], "spread_max_s": [0.0],
...         "tuner_config_version": [0]}, schema=KEYS_SCHEMA)
...     return WindowFeatures(float(t), 1.0, keys, empty_ranks(), {})
>>> out = []
>>> for t in range(100):
...     out += det.process(window(t, 0.01 * (2.5 if 60 <= t < 80 else 1.0) * (1 + 0.01 * rng.standard_normal())))
>>> [(c.kind, c.start_s, c.detected_s, round(c.magnitude, 1)) for c in out]
[('bandwidth', 60.0, 61.0, 2.2), ('recovery', 82.0, 82.0, 0.4)]
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field

import numpy as np

from dynamiccl.detector.config import DetectorConfig
from dynamiccl.detector.cusum_bank import CUSUMBank
from dynamiccl.detector.events import RegimeChange

__all__ = ["InterimDetector", "make_detector", "DetectorConfig"]


@dataclass
class _Active:
    change: RegimeChange
    streams: set = field(default_factory=set)


class InterimDetector:
    """See the module docstring. ``capacity`` streams at most (more are counted in ``dropped_streams``)."""

    name = "interim (report.detect.InterimDetector: per-stream CUSUMBank)"

    def __init__(self, config: DetectorConfig | None = None, *, capacity: int = 8192):
        self.config = (config or DetectorConfig()).validate()
        c = self.config
        self.banks = [CUSUMBank(n_streams=capacity, delta=float(d), arl0=c.arl0, warmup=c.warmup,
                                min_value=None, z_clip=100.0) for d in c.deltas]
        self.capacity = capacity
        self._index: dict[tuple, int] = {}
        self._names: list[tuple] = []
        self._starts: list[float] = []  # window_start per bank step
        self._active: dict[str, list[_Active]] = {}
        self._last_up: dict[str, float] = {}
        self._n = 0
        self.windows = 0
        self.dropped_streams = 0

    def _idx(self, key: tuple) -> int:
        i = self._index.get(key)
        if i is None:
            if len(self._names) >= self.capacity:
                self.dropped_streams += 1
                return -1
            i = self._index[key] = len(self._names)
            self._names.append(key)
        return i

    def process(self, wf) -> list[RegimeChange]:
        c = self.config
        self.windows += 1
        step = len(self._starts)
        self._starts.append(wf.window_start)
        x = np.full(self.capacity, np.nan)
        k = wf.keys
        if k.height:
            import polars as pl
            g = (k.filter(pl.col("lat_p50_s").is_not_null())
                 .sort("records", descending=True)
                 .group_by("job_id", "comm_hash", "func", "size_bucket", maintain_order=True)
                 .agg(pl.col("lat_p50_s").first(), pl.col("instances").sum(), pl.col("comm_name").first(),
                      pl.col("nranks").first()))
            for r in g.iter_rows(named=True):
                lat = r["lat_p50_s"]
                if r["instances"] < c.min_instances or not (0 < lat <= c.max_latency_s):
                    continue
                i = self._idx((r["job_id"], r["comm_hash"], r["func"], r["size_bucket"], r["comm_name"]))
                if i >= 0:
                    x[i] = math.log(lat)
        fired = np.zeros(self.capacity, bool)
        direction = np.zeros(self.capacity, np.int8)
        start = np.full(self.capacity, step, np.int64)
        ratio = np.ones(self.capacity)
        for bank in self.banks:
            bank.update_many(x)
            f = np.asarray(bank.drift_detected)
            if f.any():
                new = f & ~fired
                _, scale = bank.baseline
                direction[new] = np.asarray(bank.direction)[new]
                start[new] = np.asarray(bank.change_start)[new]
                ratio[new] = np.exp(np.asarray(bank.magnitude)[new] * scale[new])
                fired |= f
        if not fired.any():
            return []
        return self._emit(wf, np.flatnonzero(fired), direction, start, ratio)

    def _emit(self, wf, idx, direction, start, ratio) -> list[RegimeChange]:
        c = self.config
        out: list[RegimeChange] = []
        by_job: dict[tuple[str, int], list[int]] = {}
        for i in idx.tolist():
            by_job.setdefault((self._names[i][0], int(direction[i])), []).append(i)
        for (job, d), streams in sorted(by_job.items()):
            t = wf.window_start
            onset = min(self._starts[max(0, min(int(start[i]), len(self._starts) - 1))] for i in streams)
            names = [self._names[i] for i in streams]
            actives = self._active.setdefault(job, [])
            if d < 0:
                ended = [a for a in actives if a.streams & set(streams)]
                for a in ended:
                    actives.remove(a)
                    self._n += 1
                    out.append(self._change(job, "recovery", onset, t, float(np.median(ratio[streams])), names,
                                            recovers=a.change.id))
                if ended:
                    continue
            elif job in self._last_up and t - self._last_up[job] <= c.merge_s:
                if actives:
                    actives[-1].streams.update(streams)
                continue
            mag = float(np.median(ratio[streams]))
            if mag < c.min_ratio and 1 / max(mag, 1e-12) < c.min_ratio:
                continue
            kind = "bandwidth" if max(n[3] for n in names) >= 16 else "latency"
            self._n += 1
            ch = self._change(job, kind, onset, t, mag, names)
            out.append(ch)
            if d > 0:
                self._last_up[job] = t
                actives.append(_Active(ch, set(streams)))
        return out

    def _change(self, job, kind, onset, t, mag, names, recovers=None) -> RegimeChange:
        uniq = lambda xs: list(dict.fromkeys(xs))  # noqa: E731
        return RegimeChange(
            id=f"rc-{job}-{self._n}", kind=kind, job_id=job, start_s=float(onset), detected_s=float(t),
            magnitude=mag, comms=uniq(f"0x{n[1]:x}" for n in names), comm_names=uniq(n[4] for n in names),
            funcs=uniq(n[2] for n in names), size_buckets=uniq(int(n[3]) for n in names), recovers=recovers,
            evidence={"detector": "interim", "streams": [f"{n[4]} {n[2]} 2^{n[3]}B" for n in names][:20]})


def make_detector(config: DetectorConfig, which: str = "auto"):
    """``which="auto"``: ``detector.service.Detector(config)`` if that module exists, else
    :class:`InterimDetector`; ``"service"`` or ``"interim"`` force one (ValueError if the
    service is missing)."""
    if which not in ("auto", "service", "interim"):
        raise ValueError(f"detector must be auto, service or interim, got {which!r}")
    if which == "interim":
        return InterimDetector(config)
    try:
        mod = importlib.import_module("dynamiccl.detector.service")
    except ModuleNotFoundError as exc:
        if exc.name != "dynamiccl.detector.service":
            raise
        if which == "service":
            raise ValueError("detector.service is not available in this installation") from None
        return InterimDetector(config)
    det = mod.Detector(config)
    if not hasattr(det, "name"):
        try:
            det.name = "detector.service.Detector"
        except AttributeError:
            pass
    return det
