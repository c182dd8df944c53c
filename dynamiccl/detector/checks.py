"""Conformance checks every detector in `detector.__all__` must pass.

Modelled on `river.checks`: `yield_checks(detector)` yields the checks that apply to a detector
(depending on its contract), `check_detector(detector)` runs them all on fresh clones. The test
suite (``tests/detector/test_conformance.py``) discovers the detectors through
``detector.__all__`` and instantiates them with their ``_unit_test_params()``.

Three contracts are recognised:

- *drift*: a `river.base.DriftDetector` (``update(x)`` then ``drift_detected``);
- *bank*: a vectorised drift detector (``update_many(array)`` then a boolean array
  ``drift_detected``), checked stream by stream;
- *anomaly*: a `river.base.AnomalyDetector` (``learn_one`` / ``score_one``).

The data are synthetic, seeded latency-like streams; no check touches the network or the clock.
Thresholds of the statistical checks are stated next to each check.

"""

from __future__ import annotations

import inspect
import math
import pickle
import typing

import numpy as np

from .checks_data import _feed, _latency, _outputs, _stream, _warm_length, _windows, kind

__all__ = ["check_detector", "yield_checks", "kind"]

# A step of STEP_SIGMAS standard deviations must be caught within STEP_MAX_DELAY samples. For the
# default CUSUM (delta = 1, two-sided ARL0 = 1e4, 200-sample warm-up: h = 9.87) Siegmund's ARL1
# at a 3 sigma shift is about 4 samples, and about 9 for the delta = 0.5, ARL0 = 1e5 test
# parameters, so 25 leaves room for an unlucky baseline without hiding a broken detector.
STEP_SIGMAS = 3.0
STEP_MAX_DELAY = 25
# Stationary stream length and the allowed number of false alarms. At the nominal ARL0 >= 1e4,
# 20 000 samples give about 2 expected alarms for a known baseline (fewer with the
# estimated-baseline calibration); 6 is ~3x that.
STATIONARY_LENGTH = 20_000
STATIONARY_MAX_ALARMS = 6
# Memory: pickle size after 10 000 updates may exceed the size after 2 000 by this much.
MEMORY_REL_TOLERANCE = 0.10
MEMORY_ABS_TOLERANCE = 4096


# ----------------------------------------------------------------------------- generic checks
def check_docstring(detector):
    """A numpydoc docstring with parameters and a runnable example."""
    doc = type(detector).__doc__ or ""
    assert doc.strip(), "missing docstring"
    assert "Parameters" in doc and ">>>" in doc, "docstring needs a Parameters section and a doctest"


def check_no_mutable_defaults(detector):
    allowed = (type(None), float, int, tuple, str, bool)
    for name, param in inspect.signature(type(detector)).parameters.items():
        assert param.default is inspect.Parameter.empty or isinstance(param.default, allowed), (
            f"parameter {name!r} has a mutable default {param.default!r}"
        )


def check_params_stored_verbatim(detector):
    """Every __init__ parameter is an attribute of the same name holding the given value."""
    for params in type(detector)._unit_test_params():
        d = type(detector)(**params)
        for name in inspect.signature(type(detector)).parameters:
            assert hasattr(d, name), f"parameter {name!r} is not stored"
        for name, value in params.items():
            assert getattr(d, name) is value or getattr(d, name) == value, name


def check_clone_idempotent(detector):
    clone = detector.clone()
    assert type(clone) is type(detector)
    assert clone._get_params() == detector._get_params()
    assert clone.clone()._get_params() == detector._get_params()


def check_repr_stable(detector):
    """repr shows hyperparameters only: equal for a clone and unchanged by updates."""
    before = repr(detector)
    assert before == repr(detector.clone())
    _outputs(detector, kind(detector), np.random.default_rng(0), 300)
    assert repr(detector) == before


def check_pickle_roundtrip(detector):
    """An unpickled copy continues exactly like the original."""
    k = kind(detector)
    n = _warm_length(detector) + 50 if k != "anomaly" else 60
    _outputs(detector, k, np.random.default_rng(1), n)
    copy = pickle.loads(pickle.dumps(detector))
    assert type(copy) is type(detector)
    a = _outputs(detector, k, np.random.default_rng(2), 100)
    b = _outputs(copy, k, np.random.default_rng(2), 100)
    assert a == b


def check_use_before_learning(detector):
    """Scoring / updating a fresh detector is safe and raises no alarm."""
    k = kind(detector)
    if k == "anomaly":
        x = _windows(np.random.default_rng(0), 1)[0]
        s = detector.score_one(x)
        assert isinstance(s, float) and math.isfinite(s)
        assert detector.score_many(np.asarray([list(x.values())])).shape == (1,)
    elif k == "bank":
        detector.update_many(np.full(detector.n_streams, 1e-3))
        assert not detector.drift_detected.any()
    else:
        detector.update(1e-3)
        assert detector.drift_detected is False


def check_bounded_memory(detector):
    """Pickle size after 10 000 updates is within 10 % (+4 KiB) of the size after 2 000."""
    k = kind(detector)
    rng = np.random.default_rng(3)

    def feed(n):
        if k == "anomaly":  # 10 000 windows through the batch path, plus some single ones
            X = _windows(rng, n)
            for x in X[:20]:
                detector.learn_one(x)
            rows = np.asarray([[x[f] for f in detector.feature_names] for x in X[20:]])
            for i in range(0, len(rows), 50):
                detector.learn_many(rows[i : i + 50])
        elif k == "bank":
            for row in _latency(rng, n * detector.n_streams).reshape(n, detector.n_streams):
                detector.update_many(row)
        else:
            for x in _latency(rng, n):
                detector.update(x)

    feed(2_000)
    size_2k = len(pickle.dumps(detector))
    feed(8_000)
    size_10k = len(pickle.dumps(detector))
    limit = size_2k * (1 + MEMORY_REL_TOLERANCE) + MEMORY_ABS_TOLERANCE
    assert size_10k <= limit, f"state grew from {size_2k} B to {size_10k} B"


# ----------------------------------------------------------------------------- drift checks
def check_bad_input_changes_nothing(detector):
    """NaN, +/-inf, negative, non-numeric and isolated absurd values are counted and change
    nothing else: inserted into a clean stream, the detector's statistics and alarms after
    every clean sample are identical to those of the clean stream alone (compared up to the
    first alarm, after which the baseline is re-learned from data that includes them).
    """
    k = kind(detector)
    rng = np.random.default_rng(4)
    warm = _warm_length(detector)
    clean = _stream(detector, _latency(rng, warm + 3_000))
    bad_cycle: list[typing.Any] = [math.nan, math.inf, -math.inf, -1.0, 1e300, 1e-300]
    if k != "bank":
        bad_cycle += [None, "n/a"]
    insert_after = set(range(warm + 10, len(clean), 50))

    def trace(det, with_bad: bool):
        out, n_bad = [], 0
        for t, x in enumerate(clean):
            if k == "bank":
                det.update_many(x)
                out.append((det.drift_detected.tolist(), det.statistic_up.tolist(),
                            det.statistic_down.tolist()))
                alarmed = bool(det.drift_detected.any())
            else:
                det.update(x)
                out.append((det.drift_detected, det.statistic_up, det.statistic_down))
                alarmed = det.drift_detected
            if alarmed:
                break
            if with_bad and t in insert_after:
                bad = bad_cycle[n_bad % len(bad_cycle)]
                n_bad += 1
                if k == "bank":
                    det.update_many(np.full(det.n_streams, bad))
                    assert not det.drift_detected.any(), f"alarm on bad value {bad!r}"
                else:
                    det.update(bad)
                    assert not det.drift_detected, f"alarm on bad value {bad!r}"
        return out, n_bad

    reference, _ = trace(detector.clone(), with_bad=False)
    observed, n_bad = trace(detector, with_bad=True)
    assert observed == reference, "bad values changed the detector's state"
    assert n_bad > 20
    counted = detector.n_invalid + detector.n_outliers
    if k == "bank":
        # the last inserted value may still be held (pending) when the trace stops
        assert (counted >= n_bad - 1).all() and (counted <= n_bad).all(), counted
    else:
        assert n_bad - 1 <= counted <= n_bad, (counted, n_bad)


def check_catches_step(detector):
    """A 3-sigma step after warm-up is caught within 25 samples, with no earlier alarm."""
    rng = np.random.default_rng(5)
    warm = _warm_length(detector)
    step_at = warm + 300
    sd = 1e-4
    x = _latency(rng, step_at + 200, sd=sd)
    direction = -1.0 if getattr(detector, "mode", "both") == "down" else 1.0
    x[step_at:] += direction * STEP_SIGMAS * sd
    values = _stream(detector, x[:step_at])
    if kind(detector) == "bank":
        post = _latency(np.random.default_rng(6), 200 * detector.n_streams, sd=sd)
        post = post.reshape(200, detector.n_streams) + direction * STEP_SIGMAS * sd
        values = np.vstack([values, post])
        first = np.full(detector.n_streams, -1)
        for t, row in enumerate(values):
            detector.update_many(row)
            first[(first < 0) & detector.drift_detected] = t
        assert (first >= 0).all(), "some streams missed the step"
        assert first.min() >= step_at, f"alarm before the step: {first}"
        assert first.max() - step_at < STEP_MAX_DELAY, f"first alarms: {first}"
        assert (detector.direction == direction).all()
    else:
        alarms = _feed(detector, x)
        assert alarms and all(t >= step_at for t in alarms[:1]), f"alarms: {alarms}"
        delay = alarms[0] - step_at
        assert delay < STEP_MAX_DELAY, f"step caught after {delay} samples"
        assert detector.direction == ("up" if direction > 0 else "down")
        assert step_at - STEP_MAX_DELAY <= detector.change_start <= alarms[0]


def check_false_alarms(detector):
    """At most 6 alarms over 20 000 stationary samples (about 2 expected at ARL0 = 1e4)."""
    rng = np.random.default_rng(7)
    if kind(detector) == "bank":
        n = detector.n_streams
        length = STATIONARY_LENGTH // n
        X = _latency(rng, length * n).reshape(length, n)
        alarms = _feed(detector, X)
    else:
        alarms = _feed(detector, _latency(rng, STATIONARY_LENGTH))
    assert len(alarms) <= STATIONARY_MAX_ALARMS, f"{len(alarms)} false alarms at {alarms}"


# ----------------------------------------------------------------------------- anomaly checks
def check_anomaly_scores_step(detector):
    """After 1000 normal windows, a step in the tail (p99 = 4 x p50) is flagged at once.

    Flagged = scored above the detector's protection threshold. The first step window and at
    least 80 % of the 20 must be flagged, and exactly the flagged ones must be refused for
    training (protected).
    """
    rng = np.random.default_rng(8)
    for x in _windows(rng, 1_000):
        detector.learn_one(x)
    assert math.isfinite(detector.threshold)
    protected_before = detector.n_protected
    step = _windows(rng, 20, tail=4.0)
    flagged = []
    for i, x in enumerate(step):
        if detector.score_one(x) > detector.threshold:
            flagged.append(i)
        detector.learn_one(x)
    assert flagged and flagged[0] == 0, f"step windows flagged: {flagged}"
    assert len(flagged) >= 0.8 * len(step), f"only {flagged} of {len(step)} step windows flagged"
    # protection refused exactly the flagged windows
    assert detector.n_protected - protected_before == len(flagged)


def check_anomaly_false_alarms(detector):
    """On stationary windows at most 2 % are scored above the threshold (q >= 0.99)."""
    rng = np.random.default_rng(9)
    X = _windows(rng, 1_500)
    rows = np.asarray([[x[f] for f in sorted(X[0])] for x in X])
    for i in range(0, 500, 10):
        detector.learn_many(rows[i : i + 10])
    flagged = 0
    for x in X[500:]:
        flagged += detector.score_one(x) > detector.threshold
        detector.learn_one(x)
    assert flagged <= 0.02 * 1_000, f"{flagged} of 1000 stationary windows flagged"


def check_batch_matches_single(detector):
    """score_many equals score_one row by row, for numpy and polars input."""
    import polars as pl

    rng = np.random.default_rng(10)
    for x in _windows(rng, 300):
        detector.learn_one(x)
    X = _windows(rng, 20)
    single = np.array([detector.score_one(x) for x in X])
    frame = pl.DataFrame(X)
    np.testing.assert_allclose(detector.score_many(frame), single, rtol=1e-5, atol=1e-7)
    rows = np.asarray([[x[f] for f in detector.feature_names] for x in X])
    np.testing.assert_allclose(detector.score_many(rows), single, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- driver
_GENERIC = (
    check_docstring,
    check_no_mutable_defaults,
    check_params_stored_verbatim,
    check_clone_idempotent,
    check_repr_stable,
    check_pickle_roundtrip,
    check_use_before_learning,
    check_bounded_memory,
)
_BY_KIND = {
    "drift": (check_bad_input_changes_nothing, check_catches_step, check_false_alarms),
    "bank": (check_bad_input_changes_nothing, check_catches_step, check_false_alarms),
    "anomaly": (check_anomaly_scores_step, check_anomaly_false_alarms, check_batch_matches_single),
}


def yield_checks(detector) -> typing.Iterator[typing.Callable]:
    """The checks that apply to ``detector``."""
    yield from _GENERIC
    yield from _BY_KIND[kind(detector)]


def check_detector(detector) -> None:
    """Run every applicable check on a fresh clone of ``detector``."""
    for check in yield_checks(detector):
        check(detector.clone())
