"""CUSUMBank stream management (grow, reset, restore a baseline, retarget) and the StreamTable."""
from __future__ import annotations

import numpy as np
import pytest

from detector.config import DetectorConfig
from detector.cusum_bank import CUSUMBank
from detector.streams import StreamTable
from detector.testing import SyntheticJob


def test_grow_keeps_old_streams_and_new_ones_warm_up():
    rng = np.random.default_rng(0)
    a = CUSUMBank(n_streams=3, warmup=20)
    b = CUSUMBank(n_streams=3, warmup=20)
    x = 10 + rng.standard_normal((100, 5))
    for i in range(50):
        a.update_many(x[i, :3])
        b.update_many(x[i, :3])
    a.grow(2)
    assert a.n_streams == 5 and a.warming_up.tolist() == [False, False, False, True, True]
    for i in range(50, 100):
        a.update_many(x[i])
        b.update_many(x[i, :3])
        assert np.array_equal(a.statistic_up[:3], b.statistic_up)   # old streams unaffected
    assert not a.warming_up.any()


def test_reset_and_set_baseline():
    bank = CUSUMBank(n_streams=2, warmup=10, mode="up", z_clip=1e9)   # no hold-back of extremes
    for _ in range(10):
        bank.update_many([1.0 + 0.01 * np.random.default_rng(1).standard_normal(), 1.0])
    bank.reset_streams([0])
    assert bank.warming_up.tolist() == [True, False]
    bank.set_baseline([0], 1.0, 0.01)
    assert not bank.warming_up.any()
    bank.update_many([1.0 + 0.01 * (bank.threshold + 2), np.nan])   # above h in one step
    assert bank.drift_detected.tolist() == [True, False]
    with pytest.raises(ValueError):
        bank.set_baseline([1], 1.0, 0.0)


def test_set_arl0_raises_the_threshold():
    bank = CUSUMBank(n_streams=1, warmup=60, delta=6.0)
    h = bank.threshold
    bank.set_arl0(1e7)
    assert bank.threshold > h and bank.arl0 == 1e7


def test_table_scales_arl0_with_streams_and_reuses_slots():
    cfg = DetectorConfig(autoencoder=False, stream_idle_s=10.0)
    tab = StreamTable(cfg)
    job = SyntheticJob(seed=0)
    ws = tab.update(job.window(0))
    assert tab.n_active == 16 and ws.idx.size == 16
    assert tab.arl0 >= 16 * 86400 / cfg.stream_false_alarms_per_day / 2
    # same keys again: same slots
    ws2 = tab.update(job.window(1))
    assert np.array_equal(np.sort(ws.idx), np.sort(ws2.idx))
    # the job goes away for longer than stream_idle_s: its streams are forgotten, slots reused
    other = SyntheticJob(seed=1, job_id="other")
    for t in range(2, 200):
        tab.update(other.window(t))
    assert tab.n_active == 16 and tab.n == 32
    tab.update(job.window(300))
    assert tab.n == 32                       # the evicted slots were reused
