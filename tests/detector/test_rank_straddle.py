"""`dynamiccl.detector.rank_straddle`: a rank-set loss in two successive windows whose ranks
together are every rank is one instance straddling both windows, not a rank that left.

A job's rank 7 is missing from window 30 and every other rank from window 31 (each window holds
part of the same instances: a step-paced job's step split across a window edge). With
``workload.straddle_union`` the streams are not re-baselined and keep their 30-sample warm-ups;
without it (the code before, the default) the loss in two successive windows re-baselined them
(on the test bed, corpus dev seed 2 at 22 s and 25 s: the warm-up restarted at 1 sample, blind
for 10 steps, and a throttle at 36 s was not reported)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig, WorkloadConfig
from dynamiccl.detector.rank_straddle import RankStraddle
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import Regime, SyntheticJob


def _feed(on: bool, missing: dict[int, tuple[int, ...]], until: int = 34):
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False))
    cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, straddle_union=on))
    det = Detector(cfg)
    job = SyntheticJob(seed=4, sigma=0.05)
    changes = []
    for t in range(until):
        changes += det.process(_true_ranks(job, job.window(t, Regime(missing_ranks=missing.get(t, ()))),
                                           missing.get(t, ())))
    tab = det.table
    idx = np.flatnonzero(tab.active[: tab.n])
    _, counts = tab.banks[0].warm_samples(idx)
    return det, counts, changes


def _true_ranks(job, wf, missing):
    """The synthetic ranks frame numbers a comm's present ranks 0.. in order; give them their
    comm rank (their place among all the comm's members), as the records carry it."""
    if not missing:
        return wf
    import polars as pl
    fix = {}
    for s in job.streams:
        present = [k for k, (r, _) in enumerate(s.ranks) if r not in missing]
        fix[s.comm_hash] = present
    rk = wf.ranks.with_columns(pl.struct("comm_hash", "rank").map_elements(
        lambda row: fix[row["comm_hash"]][row["rank"]], return_dtype=wf.ranks.schema["rank"]).alias("rank"))
    return dataclasses.replace(wf, ranks=rk)


def _all_ranks() -> set[int]:
    job = SyntheticJob(seed=4, sigma=0.05)
    return {r for s in job.streams for r, _ in s.ranks}


def _straddle() -> dict[int, tuple[int, ...]]:
    return {30: (7,), 31: tuple(sorted(_all_ranks() - {7}))}


def test_straddling_instance_keeps_the_warmups():
    det, counts, changes = _feed(True, _straddle())
    assert changes == []
    assert det.table.straddle.n_straddles > 0
    assert det.table.n_rebased == 0
    assert counts.min() >= 30, counts


def test_without_the_rule_the_straddle_rebaselines():
    det, counts, _ = _feed(False, _straddle())
    assert det.table.n_rebased > 0 and det.table.straddle.n_straddles == 0


@pytest.mark.parametrize("on", [True, False])
def test_rank_gone_from_both_windows_is_still_a_loss(on):
    """Rank 7 missing from windows 30 and 31: the union lacks it, so the streams are re-baselined
    with the rule as without it."""
    det, _, _ = _feed(on, {30: (7,), 31: (7,)})
    assert det.table.n_rebased > 0 and det.table.straddle.n_straddles == 0


def test_split_unit():
    r = RankStraddle(3, enabled=True)
    i = np.array([0, 1, 2])
    lost_now = np.array([True, True, False])
    # first window: remembered, nothing to split (no previous loss)
    out = r.split(i, lost_now, np.zeros(3, bool), lambda: np.array([0b01, 0b01, 0b11], np.uint64), np.array([2, 2, 2]))
    assert out.tolist() == [False, False, False]
    # second window: stream 0 shows the other rank (union 2: a straddle), stream 1 the same one
    out = r.split(i, lost_now, np.array([True, True, False]),
                  lambda: np.array([0b10, 0b01, 0b11], np.uint64), np.array([2, 2, 2]))
    assert out.tolist() == [False, True, False] and r.n_straddles == 1
    off = RankStraddle(1, enabled=False)
    assert off.split(np.array([0]), np.array([True]), np.array([True]), lambda: 1 / 0, np.array([2])).tolist() == [True]


def test_switch_is_validated():
    with pytest.raises(ValueError, match="straddle_union"):
        WorkloadConfig(straddle_union="yes").validate()
