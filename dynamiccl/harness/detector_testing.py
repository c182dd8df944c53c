"""Synthetic feature-stream windows for tests and examples (no simulator needed).

`SyntheticJob` describes a job as streams (communicator, collective, size) on hosts; `window(t)`
builds the collector's ``keys`` and ``ranks`` frames for window ``t`` with seeded noise, under
an optional *regime*: per-stream latency multipliers, a straggler rank, changed message sizes,
missing ranks.

>>> job = SyntheticJob(seed=1)
>>> wf = job.window(0)
>>> wf.keys.height, sorted(set(wf.keys["comm_name"]))[:3]
(16, ['dp0', 'dp1', 'dp2'])
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from dynamiccl.collector.features import KEYS_SCHEMA, RANKS_SCHEMA, WindowFeatures

__all__ = ["SyntheticJob", "Regime", "bandwidth_regime", "latency_regime", "run_cross_levels"]

EPOCH = 1_767_225_600.0


@dataclass(frozen=True)
class Stream:
    comm: str
    comm_hash: int
    func: str
    nbytes: int
    nnodes: int
    ranks: tuple[tuple[int, str], ...]   # (global rank, host) in comm-rank order
    base_s: float                         # latency at baseline
    per_window: int                       # instances per window


@dataclass
class Regime:
    """What differs from the baseline in a window."""
    mult: dict[int, float] = field(default_factory=dict)   # stream index -> latency multiplier
    straggler: int | None = None                           # global rank arriving late
    straggler_delay_s: float = 0.0
    size_mult: dict[int, float] = field(default_factory=dict)  # stream index -> bytes multiplier
    missing_ranks: tuple[int, ...] = ()                     # global ranks not reporting
    instances_frac: float = 1.0                             # < 1: a partial window
    version: dict[int, int] = field(default_factory=dict)   # stream index -> tuner config version


class SyntheticJob:
    """Two nodes × 4 GPUs: tp (intra-node, 64 MiB), 4 dp comms (cross-node: 64 KiB, 1 MiB,
    16 MiB), world (8 B and 1 MiB). Latency model: ``alpha + bytes / bw`` per stream with
    lognormal per-window noise ``sigma``."""

    def __init__(self, *, seed: int = 0, sigma: float = 0.01, job_id: str = "job", window_s: float = 1.0):
        self.rng = np.random.default_rng(seed)
        self.sigma = sigma
        self.job_id = job_id
        self.window_s = window_s
        hosts = ["node-0", "node-1"]
        ranks = [(r, hosts[r // 4]) for r in range(8)]
        streams = []
        streams.append(Stream("tp0", 0x100, "AllReduce", 64 << 20, 1, tuple(ranks[:4]), 2.8e-4, 400))
        streams.append(Stream("tp1", 0x101, "AllReduce", 64 << 20, 1, tuple(ranks[4:]), 2.8e-4, 400))
        for i in range(4):
            members = (ranks[i], ranks[i + 4])
            for nb, base in ((64 << 10, 2.3e-5), (1 << 20, 5.3e-5), (16 << 20, 4.0e-4)):
                streams.append(Stream(f"dp{i}", 0x200 + i, "AllReduce", nb, 2, members, base, 150))
        streams.append(Stream("world0", 0x300, "AllReduce", 8, 2, tuple(ranks), 4.0e-5, 20))
        streams.append(Stream("world0", 0x300, "AllGather", 1 << 20, 2, tuple(ranks), 9.0e-5, 40))
        self.streams = streams

    def large(self, min_bytes: int = 1 << 20) -> list[int]:
        return [i for i, s in enumerate(self.streams) if s.nnodes > 1 and s.nbytes >= min_bytes]

    def small(self, max_bytes: int = 64 << 10) -> list[int]:
        return [i for i, s in enumerate(self.streams) if s.nnodes > 1 and s.nbytes <= max_bytes]

    def window(self, t: int, regime: Regime | None = None) -> WindowFeatures:
        reg = regime or Regime()
        rng = self.rng
        keys: dict[str, list] = {c: [] for c in KEYS_SCHEMA}
        ranks: dict[str, list] = {c: [] for c in RANKS_SCHEMA}
        per_comm_short: dict[int, dict[int, int]] = {}
        per_comm_info: dict[int, tuple] = {}
        for i, s in enumerate(self.streams):
            members = [(r, h) for r, h in s.ranks if r not in reg.missing_ranks]
            if not members:
                continue
            n_inst = max(1, int(round(s.per_window * reg.instances_frac)))
            nb = int(s.nbytes * reg.size_mult.get(i, 1.0))
            lat = s.base_s * reg.mult.get(i, 1.0) * (nb / s.nbytes if i in reg.size_mult and nb > 4096 else 1.0)
            in_straggler = reg.straggler is not None and any(r == reg.straggler for r, _ in members)
            if in_straggler:
                lat += reg.straggler_delay_s
            lat *= float(np.exp(rng.normal(0.0, self.sigma)))
            recs = n_inst * len(members)
            keys["job_id"].append(self.job_id)
            keys["comm_name"].append(s.comm)
            keys["func"].append(s.func)
            keys["algo"].append("RING")
            keys["proto"].append("SIMPLE" if nb >= 1 << 16 else "LL")
            keys["comm_hash"].append(s.comm_hash)
            keys["size_bucket"].append(int(np.floor(np.log2(max(nb, 1)))))
            keys["nranks"].append(len(s.ranks))
            keys["nnodes"].append(s.nnodes)
            keys["records"].append(recs)
            keys["instances"].append(n_inst)
            keys["bytes_total"].append(recs * nb)
            for c in ("lat_mean_s", "lat_p50_s", "lat_p90_s"):
                keys[c].append(lat)
            keys["lat_p99_s"].append(lat * 1.2)
            keys["lat_max_s"].append(lat * 1.5)
            keys["algbw_Bps"].append(nb / lat)
            keys["busbw_Bps"].append(nb / lat)
            keys["spread_p50_s"].append(lat * 0.02)
            keys["spread_max_s"].append(lat * 0.1)
            keys["tuner_config_version"].append(reg.version.get(i, 0))
            short = per_comm_short.setdefault(s.comm_hash, {r: 0 for r, _ in members})
            per_comm_info[s.comm_hash] = (members, len(s.ranks))
            # who had the strictly shortest duration, per instance
            if in_straggler:
                short[reg.straggler] = short.get(reg.straggler, 0) + n_inst
            else:
                who = rng.integers(0, len(members), n_inst)
                for j in np.bincount(who, minlength=len(members)).nonzero()[0]:
                    r = members[int(j)][0]
                    short[r] = short.get(r, 0) + int(np.bincount(who, minlength=len(members))[j])
        for ch, short in per_comm_short.items():
            members, nranks = per_comm_info[ch]
            for pos, (r, h) in enumerate(members):
                ranks["job_id"].append(self.job_id)
                ranks["comm_hash"].append(ch)
                ranks["rank"].append(pos if len(members) == nranks else [m for m, _ in per_comm_info[ch][0]].index(r))
                ranks["host"].append(h)
                ranks["records"].append(100)
                ranks["lat_mean_s"].append(1e-3)
                ranks["rel_lat_mean"].append(0.5 if r == reg.straggler else 1.0)
                ranks["shortest_count"].append(short.get(r, 0))
                ranks["instances_complete"].append(100)
        return WindowFeatures(EPOCH + t * self.window_s, self.window_s,
                              pl.DataFrame(keys, schema=KEYS_SCHEMA), pl.DataFrame(ranks, schema=RANKS_SCHEMA), {})


def bandwidth_regime(job: SyntheticJob, factor: float = 1.5) -> Regime:
    """Bandwidth loss: large cross-node messages ×factor, small ones nearly unchanged."""
    mult = {}
    for i, s in enumerate(job.streams):
        if s.nnodes > 1:
            frac = s.nbytes / (s.nbytes + (256 << 10))  # share of time that is bandwidth-bound
            mult[i] = 1.0 + (factor - 1.0) * frac
    return Regime(mult=mult)


def latency_regime(job: SyntheticJob, added_s: float = 20e-6) -> Regime:
    """Added latency: every cross-node stream +added_s (so small messages change most)."""
    return Regime(mult={i: (s.base_s + added_s) / s.base_s for i, s in enumerate(job.streams) if s.nnodes > 1})


def run_cross_levels(detector, level_at, windows: int, *, seed: int = 5, sigma: float = 0.01) -> list:
    """Feed ``detector`` windows ``0 .. windows - 1`` of a `SyntheticJob` whose cross-node streams run at
    latency x ``level_at(t)`` (1: the baseline); return the regime changes it reported."""
    job = SyntheticJob(seed=seed, sigma=sigma)
    cross = [i for i, s in enumerate(job.streams) if s.nnodes > 1]
    out: list = []
    for t in range(windows):
        m = level_at(t)
        out += detector.process(job.window(t, Regime(mult={i: m for i in cross}) if m != 1.0 else None))
    return out
