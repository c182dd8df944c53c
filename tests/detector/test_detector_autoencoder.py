"""Autoencoder: protection, determinism, batch inputs, bad values, optional torch import."""

from __future__ import annotations

import builtins
import math
import pickle

import numpy as np
import polars as pl
import pytest

from dynamiccl.detector import Autoencoder
from dynamiccl.detector.checks import _windows


def _trained(n=600, **params):
    ae = Autoencoder(seed=3, **params)
    rng = np.random.default_rng(0)
    for x in _windows(rng, n):
        ae.learn_one(x)
    return ae, rng


def test_score_before_learning_is_zero():
    ae = Autoencoder(seed=0)
    x = _windows(np.random.default_rng(0), 1)[0]
    assert ae.score_one(x) == 0.0
    assert ae.score_many(pl.DataFrame([x])).tolist() == [0.0]


def test_same_seed_same_scores_different_seed_different():
    a, _ = _trained(300)
    b, _ = _trained(300)
    x = _windows(np.random.default_rng(9), 1)[0]
    assert a.score_one(x) == b.score_one(x)
    c = Autoencoder(seed=4)
    for x2 in _windows(np.random.default_rng(0), 300):
        c.learn_one(x2)
    assert c.score_one(x) != a.score_one(x)


def test_protection_refuses_a_persistent_anomaly():
    ae, rng = _trained(800)
    learned = ae.n_learned
    threshold = ae.threshold
    scores = []
    for x in _windows(rng, 100, tail=4.0):
        scores.append(ae.score_one(x))
        ae.learn_one(x)
    assert ae.n_learned - learned <= 10  # at most a few borderline windows learned
    assert ae.threshold <= threshold * 1.05  # censoring: the anomaly does not drag it up
    assert np.median(scores[-20:]) > ae.threshold  # still flagged at the end


def test_without_protection_the_anomaly_is_learned():
    ae, rng = _trained(800, protect=False)
    first = [ae.score_one(x) for x in _windows(np.random.default_rng(1), 20, tail=4.0)]
    for x in _windows(rng, 400, tail=4.0):
        ae.learn_one(x)
    later = [ae.score_one(x) for x in _windows(np.random.default_rng(1), 20, tail=4.0)]
    assert np.median(later) < 0.5 * np.median(first)


def test_bad_values_are_imputed_and_counted():
    ae, _ = _trained(300)
    x = _windows(np.random.default_rng(5), 1)[0]
    s = ae.score_one(x)
    bad = dict(x, lat_p99_s=math.nan, busbw_Bps="n/a")
    del bad["bytes_total"]
    assert math.isfinite(ae.score_one(bad))
    before = ae.n_invalid_values
    ae.learn_one(bad)
    assert ae.n_invalid_values == before + 3
    huge = dict(x, lat_p99_s=1e300)
    assert math.isfinite(ae.score_one(huge)) and ae.score_one(huge) > 10 * s
    ae.learn_one(dict(x, new_feature=1.0))  # unseen features are ignored
    assert "new_feature" not in ae.feature_names


def test_numpy_and_polars_batches():
    ae = Autoencoder(seed=1)
    X = _windows(np.random.default_rng(2), 400)
    frame = pl.DataFrame(X)
    for i in range(0, 400, 20):
        ae.learn_many(frame[i : i + 20])
    assert ae.feature_names == tuple(sorted(X[0]))
    assert ae.n_learned == 400
    rows = frame.select(list(ae.feature_names)).to_numpy()
    np.testing.assert_allclose(ae.score_many(rows), ae.score_many(frame), rtol=1e-6)
    with pytest.raises(ValueError):
        ae.score_many(rows[:, :2])


def test_pickle_roundtrip_continues_identically():
    ae, rng = _trained(300)
    copy = pickle.loads(pickle.dumps(ae))
    for x in _windows(rng, 50):
        assert ae.score_one(x) == copy.score_one(x)
        ae.learn_one(x)
        copy.learn_one(x)


def test_missing_torch_gives_install_hint(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r"pip install 'dynamiccl\[autoencoder\]'"):
        Autoencoder()


def test_importing_detector_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, dynamiccl.detector; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("params", [{"q": 1.0}, {"q": 0.0}, {"lr": 0.0}, {"window_size": 1},
                                    {"hidden_dim": 0}, {"grace_period": -1}])
def test_invalid_hyperparameters_raise(params):
    with pytest.raises(ValueError):
        Autoencoder(**params)
