"""The step-rate stream (`dynamiccl.detector.step_rate`): a job whose steps slow down while its
collectives' latencies stay as noisy as ever is reported from its rate of collectives; a
checkpoint pause (and its partial windows) is not a change."""
from __future__ import annotations

import numpy as np
import polars as pl

from dynamiccl.collector.features import WindowFeatures, empty_keys, empty_ranks
from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.detector.step_rate import STEP_FUNC, StepRate
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

WARM = 70


def _detector(**overrides) -> Detector:
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False))
    return Detector(cfg.replace(**{"streams.step_rate": True, **overrides}))


def _noisy_job() -> SyntheticJob:
    # per-window p50s that vary ~1.6x (sigma 0.5 in log), like the test bed's 4-64 KiB buckets
    return SyntheticJob(seed=11, sigma=0.5)


def _slower_steps(det: Detector, job: SyntheticJob, n: int = WARM + 15, frac: float = 0.45):
    """From ``WARM`` on, ``frac`` of the usual instances per window (steps 1/frac longer),
    the collectives' latencies unchanged."""
    out = []
    for t in range(n):
        out += det.process(job.window(t, Regime(instances_frac=frac) if t >= WARM else None))
    return out


def test_slower_steps_with_noisy_latencies_are_reported():
    det = _detector()
    out = _slower_steps(det, _noisy_job())
    deg = [c for c in out if c.kind != "recovery"]
    assert deg, det.fusion.counters
    assert deg[0].detected_s - (EPOCH + WARM) <= 5.0, deg[0]
    assert STEP_FUNC in deg[0].funcs
    assert deg[0].kind == "bandwidth"          # a throughput loss: no size response to judge


def test_slower_steps_are_missed_without_the_step_rate():
    """The defect: the same run with the step-rate stream off reports nothing."""
    det = _detector(**{"streams.step_rate": False})
    out = _slower_steps(det, _noisy_job())
    assert [c for c in out if c.kind != "recovery"] == []


def _pause(det: Detector, job: SyntheticJob, start: int, length: int, n: int):
    """A checkpoint pause: windows ``start`` .. ``start + length - 1`` empty, the window before and
    the one after it only partly covered by the job (30 % of its instances)."""
    out = []
    for t in range(n):
        if start <= t < start + length:
            wf = WindowFeatures(EPOCH + t * job.window_s, job.window_s, empty_keys(), empty_ranks())
        elif t in (start - 1, start + length):
            wf = job.window(t, Regime(instances_frac=0.3))
        else:
            wf = job.window(t)
        out += det.process(wf)
    return out


def test_checkpoint_pause_is_no_change():
    job = SyntheticJob(seed=5, sigma=0.05)
    det = _detector()
    out = _pause(det, job, WARM + 10, 8, WARM + 40)
    assert out == [], [(c.kind, c.funcs, c.detected_s - EPOCH) for c in out]
    assert det.table.step_rate.held_back > 0      # the first window after the pause was held back


def _keys(comm: int, instances: int) -> pl.DataFrame:
    job = SyntheticJob(seed=1)
    k = job.window(0).keys.filter(pl.col("comm_hash") == comm)
    return k.with_columns(pl.lit(instances, dtype=pl.Int64).alias("instances"))


def test_rows_need_the_window_before():
    """A window's rate is emitted only when the window before it had data from the same
    communicator (a first window after a gap is partial); contiguity is by window start."""
    sr = StepRate()
    k = _keys(0x200, 10)
    n = k.height
    assert sr.rows(k, 0.0, 1.0) is None                  # first window: held back
    r = sr.rows(k, 1.0, 1.0)
    assert r is not None and r.height == 1
    assert r["instances"][0] == 10 * n
    assert np.isclose(r["lat_p50_s"][0], 1.0 / (10 * n))
    assert sr.rows(k, 5.0, 1.0) is None                  # after a 3-window gap: held back
    assert sr.rows(k, 6.0, 1.0).height == 1
    assert sr.rows(empty_keys(), 7.0, 1.0) is None
    assert sr.rows(k, 8.0, 1.0) is None                  # the window before had nothing
    assert sr.emitted == 2 and sr.held_back == 3
