"""The public change-point benchmark's scorers (benchmarks/public_changepoint.py) on hand-made
cases: RTT F1 with its ±5 margin, NAB's windowedGaussian alarm rule, the split."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "public_changepoint.py"
_spec = importlib.util.spec_from_file_location("public_changepoint", _PATH)
pc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pc)


def test_f1_at_margin_matches_each_change_once():
    assert pc.f1_at_margin([100, 200], [98, 205]) == 1.0
    assert pc.f1_at_margin([100, 200], [94]) == 0.0  # 6 samples off: outside the margin
    # two alarms near one change: one true positive, one false positive
    assert pc.f1_at_margin([100], [99, 101]) == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    assert pc.f1_at_margin([100], []) == 0.0


def test_windowed_gaussian_alarm_rule_is_nabs():
    """Score 1 - Q(|z|) written with 12 significant digits reads 1.0 from |z| about 7.1."""
    base = [0.0, 1.0] * 50  # mean 0.5, std 0.5; index 1 alarms as in NAB (std of one value: 1e-6)
    assert pc.run_windowed_gaussian(base + [0.5 + 0.5 * 7.2]) == [(1, 1), (100, 100)]
    assert pc.run_windowed_gaussian(base + [0.5 + 0.5 * 7.0]) == [(1, 1)]
    assert pc.run_windowed_gaussian(base + [math.nan]) == [(1, 1)]


def test_split_is_fixed_by_name():
    halves = {pc.split_of(f"rtt/{i}.csv", 0) for i in range(20)}
    assert halves == {"dev", "eval"}
    assert pc.split_of("tcpd/nile", 0) == "dev" and pc.split_of("tcpd/bank", 0) == "eval"


def test_nab_breakdown_classifies_alarms_by_the_scorers_rules():
    """`--per-file`: first hit per window (0 = window start), misses, alarms outside windows
    (and those after a window), alarms in the probation period (15 % of 1000 = 150)."""
    windows = [(300, 400), (600, 700)]
    b = pc.nab_breakdown([100, 250, 350, 360, 500, 900], windows, 1000)
    assert b["hit_at"] == [0.5, None]
    assert b["missed"] == 1
    assert (b["outside"], b["outside_after_window"], b["in_probation"]) == (3, 2, 1)
    assert b["raw"] == pytest.approx(pc.nab_raw_score([100, 250, 350, 360, 500, 900], windows, 1000))
