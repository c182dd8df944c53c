"""Where a reported change's delay goes (`dynamiccl.harness.corpus_delay`), and the window a replay
or simulated run uses when none is given (the collector's default)."""
import pytest

from dynamiccl.harness.corpus_delay import split_delay, summarise_parts


def test_parts_add_up_to_the_delay_and_sit_at_the_window_edges():
    p = split_delay(onset=100.2, applied=100.3, detected=103.0, window_s=1.0, alarm_end=102.0, recovery=False)
    assert p == pytest.approx({"apply": 0.1, "close": 0.7, "cusum": 1.0, "fusion": 1.0})
    assert sum(p.values()) == pytest.approx(103.0 - 100.2)
    half = split_delay(onset=100.2, applied=100.3, detected=101.5, window_s=0.5, alarm_end=101.5, recovery=False)
    assert half == pytest.approx({"apply": 0.1, "close": 0.2, "cusum": 1.0, "fusion": 0.0})


def test_a_recovery_or_a_missing_alarm_puts_the_wait_in_the_cusum_part():
    for kw in ({"alarm_end": 101.0, "recovery": True}, {"alarm_end": None, "recovery": False},
               {"alarm_end": 105.0, "recovery": False}):    # an alarm after the report is not its alarm
        p = split_delay(onset=100.0, applied=100.0, detected=102.0, window_s=1.0, **kw)
        assert p["fusion"] == 0.0 and p["cusum"] == pytest.approx(1.0) and p["close"] == pytest.approx(1.0)


def test_summary_counts_only_changes_reported_within_5s():
    rows = [{"reported": True, "delay_s": 2.0, "kind": "bandwidth", "paced": False, "data_windows": 2,
             "apply": 0.0, "close": 0.5, "cusum": 1.0, "fusion": 0.5},
            {"reported": True, "delay_s": 7.0, "kind": "recovery", "paced": False, "data_windows": 7,
             "apply": 0.0, "close": 0.5, "cusum": 6.5, "fusion": 0.0},
            {"reported": False}]
    s = summarise_parts(rows)
    assert s["changes"] == 3 and s["reported"] == 1 and s["median_delay_s"] == 2.0
    assert s["recovery"]["n"] == 0 and s["alarm"]["n"] == 1


def test_simulated_windows_default_to_the_collectors(monkeypatch):
    """Before: `SimFeed` and `replay` held their own 1.0 s; a changed collector default did not
    reach the evaluation."""
    import dataclasses

    from dynamiccl.collector import config as cc
    from dynamiccl.harness import simfeed
    from dynamiccl.harness.detector_suite import load_workload

    monkeypatch.setattr(simfeed, "WindowConfig", dataclasses.make_dataclass(
        "W", [("window_s", float, dataclasses.field(default=0.5))], bases=(cc.WindowConfig,), frozen=True))
    feed = simfeed.SimFeed(load_workload("small"), seed=0, duration_s=3.0)
    assert {wf.window_s for wf in feed.windows()} == {0.5}
