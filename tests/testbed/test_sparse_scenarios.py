"""The sparse job's test-bed scenarios (issue 17): one all-reduce per ~5 s step, a 1.5x throttle,
the live detector at ``DetectorConfig()``; and how a run is scored. No root needed."""
from __future__ import annotations

import pytest

from dynamiccl.harness.testbed import sparse
from dynamiccl.harness.testbed.scenario import Scenario, load


def test_scenarios_are_a_function_of_the_seed_and_valid():
    for seed in range(12):
        a, b = sparse.scenario(seed), sparse.scenario(seed)
        assert a == b
        assert 2 <= a.nranks <= 4 and a.buckets == "2m" and a.detector == "defaults" and a.window_s == 1.0
        assert len(a.actions) == 1 and a.actions[0].do == "throttle"
        assert a.actions[0].mbit == sparse.THROTTLE_MBIT
        onset = a.warmup_s + a.actions[0].at_s
        # onsets inside the job's first minute for seed % 4 in (0, 1), after several minutes otherwise
        assert (35 <= onset <= 55) if seed % 4 in (0, 1) else (180 <= onset <= 300)
        # a step of ~5 s: compute plus the all-reduce
        assert a.compute_ms / 1000 < sparse.STEP_S


def test_split_by_seed_parity():
    assert [sparse.split(s) for s in range(4)] == ["dev", "eval", "dev", "eval"]


def test_stationary_scenario_file_is_one_hour_without_changes():
    from pathlib import Path
    sc = load(str(Path(sparse.__file__).parent / "scenarios" / "sparse-stationary.yaml"))
    assert sc.actions == () and sc.duration_s - sc.warmup_s == 3600
    assert sc.detector == "defaults" and sc.buckets == "2m"


def test_detector_field_picks_the_live_settings():
    from dynamiccl.detector.config import DetectorConfig
    from dynamiccl.harness.testbed.detect import LiveDetector
    assert LiveDetector(1.0, defaults=True).config.flat() == DetectorConfig().flat()
    assert LiveDetector(0.5).config.flat() != DetectorConfig().flat()  # the test bed's own settings
    with pytest.raises(ValueError, match="detector must be one of"):
        Scenario("x", detector="tuned").validate()




def test_first_report_counts_steps_and_false_alarms():
    inst = {"start": [0.0, 5.0, 10.0, 15.0, 20.0], "end": [0.4, 5.4, 10.6, 15.6, 20.6]}
    reports = [(3.0, {"kind": "latency", "magnitude": 1.3}),      # before the onset: a false alarm
               (12.0, {"kind": "recovery", "magnitude": 0.8}),    # a recovery does not report a slowdown
               (16.0, {"kind": "latency", "magnitude": 1.5}),
               (30.0, {"kind": "latency", "magnitude": 1.5})]
    got = sparse._first_report(reports, 9.0, inst)
    assert got["false_alarms"] == 1 and got["reported"] and got["delay_s"] == 7.0
    assert got["steps"] == 2 and got["later_reports"] == 1  # instances at 10 and 15 had finished by 16
    assert sparse._first_report(reports, None, inst)["false_alarms"] == 4  # stationary: all of them
    assert not sparse._first_report(reports[:2], 9.0, inst)["reported"]


def test_slowdown_is_the_median_ratio_around_the_onset():
    inst = {"start": [float(i) for i in range(20)], "dur": [0.4] * 10 + [0.6] * 10}
    assert sparse.slowdown(inst, 9.5) == pytest.approx(1.5)


def test_defaults_run_gives_the_detector_every_window(tmp_path):
    """A `detector: defaults` run is `dynamiccl replay`'s twin: every window from the first goes to
    the detector (a start-up window left out shifted a sparse job's instance pairs: live and replay
    reported one slowdown 4 steps apart); test-bed-settings runs still start at their settle time."""
    import math

    from dynamiccl.harness.testbed.run import Run
    for detector, expect in (("defaults", -math.inf), ("testbed", math.inf)):
        run = Run(Scenario("x", detector=detector), out_dir=tmp_path / detector, prefix="dtb0000")
        try:
            assert run.detect_from == expect
        finally:
            run.close()
