"""Conformance suite over every detector class exported by `detector` (river style)."""

from __future__ import annotations

import inspect

import pytest
from river import base
from river.checks import common as river_common

from dynamiccl import detector
from dynamiccl.detector import checks

DETECTOR_CLASSES = [
    obj for name in detector.__all__ if inspect.isclass(obj := getattr(detector, name))
]


def _instances():
    for cls in DETECTOR_CLASSES:
        for params in cls._unit_test_params():
            yield cls(**params)


def _label(det) -> str:
    return repr(det).replace("\n", "").replace(" ", "")


def test_all_exports_are_detectors():
    """Nothing in __all__ silently escapes the suite."""
    assert DETECTOR_CLASSES, "no detector discovered"
    for cls in DETECTOR_CLASSES:
        assert issubclass(cls, base.Base), cls
        checks.kind(next(_instances_of(cls)))


def _instances_of(cls):
    for params in cls._unit_test_params():
        yield cls(**params)


def test_star_import_matches_all():
    namespace: dict = {}
    exec("from dynamiccl.detector import *", namespace)
    assert set(detector.__all__) <= set(namespace)


@pytest.mark.parametrize(
    "det, check",
    [
        pytest.param(det, check, id=f"{_label(det)}:{check.__name__}")
        for det in _instances()
        for check in checks.yield_checks(det)
    ],
)
def test_conformance(det, check):
    check(det.clone())


# river's own dataset-free checks. `check_tags` needs river's Estimator (the drift detector
# bases are not Estimators), so it runs only where it applies.
_RIVER_CHECKS = [
    river_common.check_repr,
    river_common.check_str,
    river_common.check_clone_same_class,
    river_common.check_clone_is_idempotent,
    river_common.check_init_has_default_params_for_tests,
    river_common.check_init_default_params_are_not_mutable,
    river_common.check_doc,
    river_common.check_clone_changes_memory_addresses,
    river_common.check_mutate_can_be_idempotent,
    river_common.check_pickling_supports_roundtrip,
    river_common.check_repr_roundtrips_clone,
    river_common.check_clone_with_new_params_applies,
    river_common.check_get_params_matches_signature,
]


def _river_cases():
    for det in _instances():
        for check in _RIVER_CHECKS:
            yield pytest.param(det, check, id=f"{_label(det)}:river.{check.__name__}")
        if isinstance(det, base.Estimator):
            yield pytest.param(det, river_common.check_tags,
                               id=f"{_label(det)}:river.check_tags")


@pytest.mark.parametrize("det, check", list(_river_cases()))
def test_river_checks(det, check):
    check(det.clone())


# river's dataset checks for anomaly detectors, fed a synthetic window stream instead of
# river's CreditCard dataset (which needs a download and scikit-learn).
_RIVER_DATASET_CHECKS = [
    river_common.check_learn_one,
    river_common.check_pickling,
    river_common.check_shuffle_features_no_impact,
    river_common.check_emerging_features,
    river_common.check_disappearing_features,
    river_common.check_radically_disappearing_features,
    river_common.check_predict_one_pure,
    river_common.check_predict_one_before_any_learn,
    river_common.check_no_state_aliasing_with_input,
    river_common.check_clone_is_independent,
    river_common.check_seeding_is_idempotent,
    river_common.check_bounded_memory_growth,
]


def _window_dataset(n=200):
    import numpy as np

    return [(x, None) for x in checks._windows(np.random.default_rng(11), n)]


@pytest.mark.parametrize(
    "det, check",
    [
        pytest.param(det, check, id=f"{_label(det)}:river.{check.__name__}")
        for det in _instances()
        if isinstance(det, base.AnomalyDetector)
        for check in _RIVER_DATASET_CHECKS
    ],
)
def test_river_anomaly_dataset_checks(det, check):
    n = 1000 if check is river_common.check_bounded_memory_growth else 200
    check(det.clone(), dataset=_window_dataset(n))
