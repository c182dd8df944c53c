"""The effect labeller: which labelled changes moved collective latency, from the records alone."""
import math

import numpy as np
import polars as pl

from dynamiccl.harness import corpus
from dynamiccl.harness.testbed.controller import TruthEvent
from dynamiccl.harness.testbed.effect import RATIO, Z, label, moved, stream_windows


def _ev(i, do, t, degrades):
    return TruthEvent(i, do, [0, 1], True, degrades, t - 1000, t, t, None, None, do)


def _windows(levels, seed=0, sd=0.01, streams=((1, 4096),)):
    """1 s windows 1000..: ``levels`` (per window, relative), noise ``sd`` (relative), per stream."""
    rng = np.random.default_rng(seed)
    rows = []
    for c, b in streams:
        for k, lv in enumerate(levels):
            rows.append((c, b, 1000 + k, 0.01 * lv * (1 + sd * rng.standard_normal())))
    return pl.DataFrame(rows, schema={"comm_hash": pl.UInt64, "bytes": pl.UInt64, "w": pl.Int64,
                                      "med": pl.Float64}, orient="row")


def test_thresholds_are_the_detector_documented_smallest_change():
    assert (RATIO, Z) == (1.1, 3.0)


def test_a_throttle_that_doubles_latency_and_its_release_moved():
    w = _windows([1.0] * 20 + [2.0] * 15 + [1.0] * 10)
    fx = label([_ev(0, "throttle", 1020.0, True), _ev(1, "release", 1035.0, False)], w)
    assert [f.rule for f in fx] == ["moved", "moved"]
    assert all(f.effective for f in fx) and 1.8 < fx[0].ratio < 2.2


def test_a_throttle_nobody_feels_and_its_release_are_no_effect():
    w = _windows([1.0] * 45, sd=0.05)
    fx = label([_ev(0, "throttle", 1020.0, True), _ev(1, "release", 1035.0, False)], w)
    assert [f.rule for f in fx] == ["no_move", "no_move"] and not any(f.effective for f in fx)


def test_a_release_of_a_no_effect_throttle_is_no_effect_whatever_the_noise():
    # the job slows by itself 5 s after the release: the release's own windows "improve", but
    # the throttle before it moved nothing, so nothing was released
    w = _windows([1.0] * 35 + [0.5] * 10, sd=0.01)
    fx = label([_ev(0, "throttle", 1020.0, True), _ev(1, "release", 1035.0, False)], w)
    assert fx[0].rule == "no_move" and fx[1].rule == "release_of_no_effect" and not fx[1].effective


def test_a_move_below_the_ratio_or_within_the_noise_is_not_a_move():
    small = _windows([1.0] * 20 + [1.05] * 10, sd=0.001)        # 1.05x, 50 sd: below RATIO
    assert label([_ev(0, "throttle", 1020.0, True)], small)[0].rule == "no_move"
    noisy = _windows([1.0, 1.6] * 10 + [1.3] * 10, sd=0.0)       # 1.3x inside a 1.0/1.6 alternation
    f = label([_ev(0, "throttle", 1020.0, True)], noisy)[0]
    assert f.rule == "no_move" and f.z < Z


def test_one_stream_that_moved_is_enough():
    w = pl.concat([_windows([1.0] * 30, streams=((1, 4096),)),
                   _windows([1.0] * 20 + [3.0] * 10, streams=((1, 1 << 20),))])
    assert label([_ev(0, "throttle", 1020.0, True)], w)[0].rule == "moved"


def test_a_sparse_stream_without_windows_before_the_onset_counts_as_effective():
    w = _windows([1.0] * 30).filter(pl.col("w") % 5 == 0)    # one window in five: 2 before a 10 s span
    fx = label([_ev(0, "throttle", 1010.0, True), _ev(1, "throttle", 1020.0, True)], w)
    assert fx[1].rule == "unmeasured" and fx[1].effective and math.isnan(fx[1].ratio)


def test_the_window_holding_the_onset_is_not_a_window_before_it():
    w = _windows([1.0] * 20 + [2.0] * 10, sd=0.0)
    ratio, z = moved(np.array([1.0, 1.0, 1.0]), np.array([2.0]), True)
    assert ratio == 2.0 and z == math.inf
    assert label([_ev(0, "throttle", 1019.5, True)], w)[0].rule == "moved"   # window 1019 is excluded


def test_stream_windows_reads_record_durations(tmp_path):
    (tmp_path / "r").mkdir()
    n = 6
    pl.DataFrame({"comm_hash": [7] * n, "bytes": [64] * n,
                  "enqueue_ns": [int(1000e9) + k * int(0.3e9) for k in range(n)],
                  "cpu_end_ns": [int(1000e9) + k * int(0.3e9) + int(2e6) for k in range(n)],
                  "gpu_end_ns": [0] * n}).write_parquet(tmp_path / "r" / "part.parquet")
    w = stream_windows(tmp_path / "r")
    assert w["w"].to_list() == [1000, 1001] and np.allclose(w["med"].to_list(), [0.002, 0.002])


def test_the_line_keeps_its_keys_and_adds_the_effective_figures():
    a = corpus.RunScore(1, changes=10, reported=9, false_alarms=1, monitored_s=1800, delays_s=[1.0, 2.0],
                        effective=8, effective_within=2)
    b = corpus.RunScore(3, changes=10, reported=10, false_alarms=0, monitored_s=1800, delays_s=[4.0],
                        effective=2, effective_within=1)
    s = corpus.summarise([a, b])
    line = corpus.line(s)
    assert line.startswith("testbed_runs=2 testbed_changes=20 testbed_within_5s=0.150 ")
    assert line.endswith(" testbed_effective_changes=10 testbed_within_5s_effective=0.300")


def test_a_release_out_of_a_noisy_regime_is_measured_in_the_quiet_regime_spread():
    """Dev seed 34's ``bulk_off``: 200-400 ms under competing traffic, 55-65 ms after. In the
    noisy regime's own sds the 5x drop was 2 sds (``no_move``); in the quiet side's it moved."""
    noisy = [1.5, 5.0, 3.2, 1.8, 4.6, 2.0, 3.3, 5.2, 1.6, 4.4] * 2    # median 3.25: 0.6 is 1.3 of its sds
    w = _windows([1.0] * 20 + noisy + [0.6, 0.55, 0.62, 0.64, 0.58] + [0.33] * 5, sd=0.0)
    fx = label([_ev(0, "bulk_on", 1020.0, True), _ev(1, "bulk_off", 1040.0, False)], w)
    assert fx[1].rule == "moved" and fx[1].ratio > 4, fx


def test_a_release_whose_queue_drains_is_measured_in_the_throttled_regime_spread():
    """Dev seed 38's release: a quiet throttled level, then 116-158 ms of queue draining and 70-83
    ms within its 5 s. Measured in the draining side's sds alone the 2x drop read 2.7 sds."""
    w = _windows([1.0] * 20 + [2.5] * 15 + [1.2, 1.3, 1.6, 0.85, 0.7] + [0.7] * 5, sd=0.005)
    fx = label([_ev(0, "throttle", 1020.0, True), _ev(1, "release", 1035.0, False)], w)
    assert [f.rule for f in fx] == ["moved", "moved"], fx
