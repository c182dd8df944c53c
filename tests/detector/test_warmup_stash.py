"""A warming stream's A -> B -> A rank set resumes its A warm-up (`dynamiccl.detector.warmup_stash`).

A job's rank 7 is missing from two successive windows (30-31: a rank-set change, the streams are
re-baselined) and back from window 32 on (a second rank-set change). With the rule the streams go
on from their 30 samples of the full rank set; before it (the rule off) they started again from
nothing twice, and sat at 1-2 samples at window 33 (on the test bed: a 4.3x throttle never
reported, dev seed 22). These tests turn `workload.rank_set_keep` off: with it on, a rank-set change at
the same level keeps the warm-up in place and nothing is stashed (last test)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import Regime, SyntheticJob


def _feed(resume: bool, gone=range(30, 32), until: int = 34, keep: bool = False):
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False))
    cfg = dataclasses.replace(cfg, baseline=dataclasses.replace(cfg.baseline, resume_warmup=resume),
                              workload=dataclasses.replace(cfg.workload, rank_set_keep=keep))
    det = Detector(cfg)
    job = SyntheticJob(seed=4, sigma=0.05)
    changes = []
    for t in range(until):
        changes += det.process(job.window(t, Regime(missing_ranks=(7,) if t in gone else ())))
    tab = det.table
    idx = np.flatnonzero(tab.active[: tab.n])
    _, counts = tab.banks[0].warm_samples(idx)
    return det, counts, changes


def test_warmup_resumes_after_the_rank_set_comes_back():
    det, counts, changes = _feed(True)
    assert det.table.n_rebased > 0
    assert changes == []
    assert det.table.warm_stash.n_resumed > 0
    assert counts.min() >= 30, counts          # 30 samples of the full rank set, and 32-33's


def test_without_the_rule_the_warmup_restarts():
    det, counts, _ = _feed(False)
    assert det.table.n_rebased > 0
    assert counts.min() <= 2, counts           # the streams with rank 7 in them


@pytest.mark.parametrize("gone", [range(30, 60)])
def test_rank_that_stays_gone_is_a_new_warmup(gone):
    """A rank that left for good: the warm-up of the smaller rank set starts afresh (no resume)."""
    det, counts, _ = _feed(True, gone=gone, until=40)
    assert det.table.warm_stash.n_resumed == 0
    assert counts.min() <= 10, counts          # ... from window 31 on


def test_stash_is_not_resumed_over_a_fixed_baseline():
    """A stream that got its fixed baseline after the stash is restored by the fixed-baseline rule;
    its old warm-up is dropped, not resumed over it."""
    from dynamiccl.detector.streams import StreamTable
    tab = StreamTable(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    tab.warm_stash.saved[0] = (np.zeros(20), 1.0, 1.0)
    tab.early.first[0] = False
    resume, _ = tab.warm_stash.take(tab, np.array([0]), np.array([1.0]), np.array([1.0]))
    assert resume == {} and 0 not in tab.warm_stash.saved


def test_with_the_rank_set_kept_the_warmup_simply_goes_on():
    """The default (`workload.rank_set_keep`): of the streams the flip touched, those whose value
    stayed within a baseline sigma keep their warm-up (no stash, no restart); those the missing
    rank moved further are re-baselined and resumed as above. No regime change either way."""
    det, counts, changes = _feed(True, keep=True)
    off, _, _ = _feed(True, keep=False)
    assert det.table.n_rank_set_kept > 0
    assert det.table.n_rebased < off.table.n_rebased
    assert changes == []
