"""A short excursion is one regime change (its closing is a transient, not a `recovery`); a
regime that lasted still gets its recovery."""
from __future__ import annotations

import time

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.service import Detector
from dynamiccl.harness.detector_testing import EPOCH, Regime, SyntheticJob

SLOW, ON = 2.0, 100


def _run(duration: int, **incidents):
    incidents = {"transient_s": 10.0, **incidents}
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


class _Retuner:
    """Records what the loop hands it."""

    def __init__(self):
        self.changes, self.ends = [], []

    def on_window(self, wf):
        return None

    def on_change(self, rc):
        self.changes.append(rc)

    def on_transient_end(self, te):
        self.ends.append(te)


def _loop_run(duration: int):
    from dynamiccl.loop import Loop
    job = SyntheticJob(seed=3, sigma=0.01)
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)).with_overrides({"incidents.transient_s": 10.0})
    rt, alerts = _Retuner(), []
    loop = Loop(Detector(cfg), rt, sinks=[alerts.append])
    cross = [i for i, s in enumerate(job.streams) if s.nnodes > 1]
    steps = [loop.step(job.window(t, Regime(mult={i: SLOW for i in cross} if ON <= t < ON + duration else {})))
             for t in range(ON + duration + 20)]
    return loop, rt, alerts, steps


def test_the_loop_tells_the_retuner_alone_that_a_transient_ended():
    """The 3 s excursion: the sinks (alerting, scorer) get its degradation only; the retuner gets the
    degradation and then a `TransientEnd` naming it, dated at the excursion's end, in the window that
    closed it."""
    loop, rt, alerts, steps = _loop_run(3)
    assert alerts and all(c.kind != "recovery" for c in alerts) and rt.changes == alerts
    (te,) = rt.ends
    assert te.ends[0] == alerts[0].id and set(te.ends) <= {c.id for c in alerts}
    assert ON + 3 - 1 <= te.start_s - EPOCH <= te.detected_s - EPOCH <= ON + 3 + 5, te
    assert te.detected_s - te.start_s < 5.0 and loop.transient_ends == 1
    (step,) = [s for s in steps if s.ended]
    assert step.ended == [te] and not step.changes
    rec = te.as_recovery()
    assert rec.kind == "recovery" and rec.recovers == alerts[0].id and rec.evidence["transient"] is True


def test_a_regime_that_lasted_ends_with_its_recovery_only():
    """The 15 s regime: its end is the `recovery` on the change stream, and no transient end."""
    loop, rt, alerts, _ = _loop_run(15)
    assert [c.kind for c in alerts].count("recovery") == 1 and rt.ends == [] and loop.transient_ends == 0


def test_the_detector_service_sends_a_transient_end_to_its_subscribers_only():
    """Separately run services (`dynamiccl detector run` → `dynamiccl retuner run`): the stream's subscriber
    (the retuner) gets the 3 s excursion's end as the recovery it stands for (``evidence.transient``); the
    log (the changes file) has the degradation only, and it is counted apart from regime changes."""
    import io

    from dynamiccl.detector.runner import DetectorService, ServiceConfig
    from dynamiccl.detector.server import subscribe_changes
    job = SyntheticJob(seed=3, sigma=0.01)
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)).with_overrides({"incidents.transient_s": 10.0})
    out = io.StringIO()
    svc = DetectorService(ServiceConfig(features=None, metrics=None, serve="tcp:127.0.0.1:0"), cfg, out=out).start()
    try:
        sub = subscribe_changes(svc.addresses["serve"], timeout=20)
        cross = [i for i, s in enumerate(job.streams) if s.nnodes > 1]
        deadline = time.monotonic() + 10
        while svc.server.n_clients < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        changes = []
        for t in range(ON + 3 + 20):
            changes += svc.process_window(job.window(t, Regime(mult={i: SLOW for i in cross} if ON <= t < ON + 3 else {})))
        got = [next(sub) for _ in range(len(changes) + 1)]
    finally:
        svc.shutdown()
    assert changes and all(c.kind != "recovery" for c in changes)
    assert [c.id for c in got[:-1]] == [c.id for c in changes]
    end = got[-1]
    assert end.kind == "recovery" and end.evidence["transient"] is True and end.recovers == changes[0].id
    logged = [line for line in out.getvalue().splitlines() if line.startswith("{")]
    assert len(logged) == len(changes)
    m = svc.metrics
    assert m.value("dynamiccl_detector_transient_ends_emitted_total") == 1
    assert m.value("dynamiccl_detector_changes_emitted_total") == len(changes)
