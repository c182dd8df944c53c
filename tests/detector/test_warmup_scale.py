"""`baseline.diff_scale` (`dynamiccl.detector.warmup_scale`): a warm-up's scale from its lagged
differences, robust to a level shift inside it, never wider than the estimator's."""
import numpy as np

from dynamiccl.detector._baseline import robust_baseline
from dynamiccl.detector.config import DetectorConfig
from dynamiccl.detector.cusum_bank import CUSUMBank
from dynamiccl.detector.streams import StreamTable
from dynamiccl.detector.warmup_scale import diff_scale, narrowed_scale

SIGMA = 0.25


def _two_regimes(seed: int, n: int = 60, shift: float = 1.0) -> np.ndarray:
    x = SIGMA * np.random.default_rng(seed).standard_normal(n)
    x[n // 2:] += shift
    return x


def test_two_regime_warmup_scale_is_the_within_regime_noise():
    x = _two_regimes(0)
    _, wide = robust_baseline(x[None], "winsorized")
    narrow = narrowed_scale(x[None], wide)
    assert wide[0] > 2.0 * SIGMA                  # the shift widens the marginal scale
    assert 0.7 * SIGMA < narrow[0] < 1.4 * SIGMA  # the differences see the noise only


def test_spiky_warmup_scale_is_not_widened_by_the_spikes():
    rng = np.random.default_rng(3)
    x = SIGMA * rng.standard_normal(60)
    x[rng.choice(60, 6, replace=False)] += rng.uniform(4 * SIGMA, 12 * SIGMA, 6)
    _, wide = robust_baseline(x[None], "winsorized")
    narrow = narrowed_scale(x[None], wide)
    assert narrow[0] <= wide[0]
    assert narrow[0] < 1.4 * SIGMA


def test_iid_and_ar1_scales_are_not_narrowed_on_average():
    """The largest lag-1..5 scale: iid and AR(1) 0.6 warm-ups keep >= 0.9 of their winsorised
    scale on average (a lag-1 difference scale alone gives 0.63 on AR(1) 0.6)."""
    rng = np.random.default_rng(7)
    for rho in (0.0, 0.6):
        e = rng.standard_normal((2000, 110))
        x = np.zeros_like(e)
        for t in range(1, 110):
            x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho * rho) * e[:, t]
        x = x[:, 50:]
        _, wide = robust_baseline(x, "winsorized")
        assert np.mean(narrowed_scale(x, wide) / wide) > 0.9, rho


def test_too_short_or_quantised_warmups_keep_their_scale():
    assert np.isnan(diff_scale(np.zeros((1, 5))))[0]
    flat = np.zeros((1, 60))
    flat[0, ::7] = 1.0
    assert narrowed_scale(flat, np.array([0.3]))[0] == 0.3


def _bank(narrow: bool) -> CUSUMBank:
    bank = CUSUMBank(n_streams=1, delta=2.0, arl0=1e5, warmup=60, min_value=None, z_clip=1e9,
                     estimator="winsorized")
    bank.narrow_scale = narrow
    return bank


def test_a_4x_move_on_a_two_regime_stream_is_reported_in_two_windows_only_with_the_rule():
    """Warm-up: log-latency noise 0.25 with a 2.7x level shift half way; then a 4x move above
    the later regime for 2 windows (delta-2 chart, h 7.2: the wide scale 0.55 fires on the 4th
    window of the move, the narrowed 0.28 on the 2nd)."""
    fired = {}
    for narrow in (False, True):
        bank = _bank(narrow)
        x = np.concatenate([_two_regimes(1), 1.0 + np.log(4.0) + SIGMA * np.random.default_rng(2).standard_normal(2)])
        fired[narrow] = False
        for v in x:
            bank.update_many(np.array([v]))
            fired[narrow] |= bool(bank.drift_detected[0])
        assert bank.n_scale_narrowed == int(narrow)
    assert fired == {False: False, True: True}


def test_the_stream_table_switches_its_banks():
    cfg = DetectorConfig()
    assert not cfg.baseline.diff_scale
    on = cfg.with_overrides({"baseline.diff_scale": True})
    assert all(b.narrow_scale for b in StreamTable(on).banks)
    assert not any(b.narrow_scale for b in StreamTable(cfg).banks)
