"""A short excursion is one regime change (its closing is a transient, not a `recovery`); a
regime that lasted still gets its recovery."""
from __future__ import annotations

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

SLOW, ON = 2.0, 100


def _run(duration: int, **incidents):
    incidents = {"transient_s": 10.0, **incidents}  # the rule is opt-in
    job = SyntheticJob(seed=3, sigma=0.01)
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)).with_overrides(
        {f"incidents.{k}": v for k, v in incidents.items()})
    det = Detector(cfg)
    cross = [i for i, s in enumerate(job.streams) if s.nnodes > 1]
    out = []
    for t in range(ON + duration + 20):
        slow = ON <= t < ON + duration
        out += det.process(job.window(t, Regime(mult={i: SLOW for i in cross} if slow else {})))
    return det, out


def _active(det) -> tuple[int, float]:
    """(series, sum of values) of the regime-active gauge."""
    vals = [s.value for m in det.metrics.registry.collect() if m.name == "dynamiccl_detector_regime_active"
            for s in m.samples]
    return len(vals), sum(vals)


def test_short_excursion_is_one_change():
    """A 3 s excursion: one degradation, no recovery; the incident is closed as a transient,
    counted, and its Prometheus gauge goes back to 0 (nothing is left active)."""
    det, out = _run(3)
    assert [c.kind for c in out if c.kind != "recovery"], out
    assert not [c for c in out if c.kind == "recovery"], [(c.kind, c.detected_s - EPOCH) for c in out]
    assert det.fusion.counters["transients"] == 1
    closed = [inc for incs in det.fusion.closed.values() for inc in incs]
    assert closed and all(inc.transient for inc in closed)
    n, on = _active(det)
    assert not det.fusion.active and n >= 1 and on == 0.0


def test_long_regime_keeps_its_recovery():
    """A 15 s regime (longer than ``transient_s``) is reported and so is its end."""
    det, out = _run(15)
    rec = [c for c in out if c.kind == "recovery"]
    assert len(rec) == 1 and rec[0].detected_s - (EPOCH + ON + 15) <= 3.0, \
        [(c.kind, c.detected_s - EPOCH) for c in out]
    assert det.fusion.counters["transients"] == 0


def test_switched_off_gives_the_recovery():
    """``transient_s`` 0: the short excursion's closing is a recovery, as before the rule."""
    det, out = _run(3, transient_s=0.0)
    assert [c.kind for c in out].count("recovery") == 1, [(c.kind, c.detected_s - EPOCH) for c in out]
