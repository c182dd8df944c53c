"""A reported change's `where` judged again on the next windows (`dynamiccl.detector.where_refresh`)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from dynamiccl.collector.features import RANKS_SCHEMA

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig, StragglerConfig
from dynamiccl.detector.events import RegimeChange
from dynamiccl.detector.service import Detector
from dynamiccl.detector.straggler import RankHistory
from dynamiccl.detector.where import locate
from dynamiccl.detector.where_refresh import MAX_PENDING, WhereRefresh, same_place

COMM = 0xABC
NR = 4


def _frame(arr: list, fin: list) -> pl.DataFrame:
    base = pl.DataFrame({"job_id": ["j"] * NR, "comm_hash": [COMM] * NR, "rank": list(range(NR)),
                         "host": [f"h{r}" for r in range(NR)], "records": [10] * NR,
                         "lat_mean_s": [0.01] * NR, "rel_lat_mean": [1.0] * NR,
                         "shortest_count": [0] * NR, "instances_complete": [10] * NR}, schema=RANKS_SCHEMA)
    return base.with_columns(pl.Series("arr_off_s", arr, pl.Float64), pl.Series("fin_off_s", fin, pl.Float64))


def _history(onset: int, upto: int, rank: int = 2, blind: int = 1) -> RankHistory:
    """Quiet offsets, then ``rank`` arrives 30 ms late from ``onset`` on; the first ``blind`` windows
    from the onset hold no complete instance (no offsets: a collective longer than a window)."""
    rng = np.random.default_rng(0)
    h = RankHistory(64)
    for step in range(upto + 1):
        arr, fin = rng.normal(0, 2e-4, NR), rng.normal(0, 2e-4, NR)
        if onset <= step < onset + blind:
            h.add(step, _frame([None] * NR, [None] * NR))
            continue
        if step >= onset:
            arr[rank] += 0.030
            fin[rank] += 0.028
        h.add(step, _frame(arr.tolist(), fin.tolist()))
    return h


def test_a_verdict_that_had_no_data_at_the_report_comes_one_window_later():
    h = _history(25, 25)
    assert locate(h, "j", [COMM], onset_step=25, now_step=25, window_s=1.0) is None   # at the report
    ref = WhereRefresh(3)
    ref.watch("rc-j-1", "j", [COMM], 25, None)
    h = _history(25, 26)
    (u,) = ref.step(h, 26, 1.0, 1027.0)
    assert (u.id, u.detected_s, u.where["rank"], u.where["rule"]) == ("rc-j-1", 1027.0, 2, "late_arrival")
    assert ref.counters["where_updated"] == 1


def test_the_same_place_again_is_no_update_and_pending_ends_after_its_windows():
    ref = WhereRefresh(2)
    h = _history(25, 27)
    ref.watch("rc-j-1", "j", [COMM], 25, None)
    assert len(ref.step(h, 26, 1.0, 1027.0)) == 1
    assert ref.step(h, 27, 1.0, 1028.0) == []          # rank 2 again: nothing new
    assert not ref.pending and ref.counters["where_refreshed"] == 2


def test_a_wrong_verdict_at_the_report_is_replaced():
    ref = WhereRefresh(3)
    ref.watch("rc-j-1", "j", [COMM], 25, {"kind": "rank", "rank": 1, "link": None})
    (u,) = ref.step(_history(25, 27), 27, 1.0, 1028.0)
    assert u.where["rank"] == 2


def test_off_and_bounded():
    off = WhereRefresh(0)
    off.watch("rc-j-1", "j", [COMM], 25, None)
    assert not off.pending
    ref = WhereRefresh(3)
    for i in range(MAX_PENDING + 5):
        ref.watch(f"rc-j-{i}", "j", [COMM], 25, None)
    assert len(ref.pending) == MAX_PENDING and ref.counters["where_refresh_dropped"] == 5


def test_same_place():
    a = {"kind": "link", "rank": 0, "link": (1, 0), "confidence": 0.5}
    assert same_place(a, {**a, "link": [1, 0], "confidence": 0.9})
    assert not same_place(a, {**a, "kind": "rank", "link": None}) and not same_place(a, None)


def test_the_detector_hands_out_the_update_on_the_next_window():
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    det.ranks = _history(25, 25)
    rc = RegimeChange(id="rc-j-1", kind="latency", job_id="j", start_s=1025.0, detected_s=1026.0, magnitude=2.0,
                      comms=[f"0x{COMM:016x}"])
    out = det._locate(rc, step=25, window_start=1025.0, window_s=1.0)
    assert "where" not in out.evidence and len(det.where_refresh.pending) == 1
    (u,) = det.where_refresh.step(_history(25, 26), 26, 1.0, 1027.0)
    assert u.id == "rc-j-1" and u.where["rank"] == 2


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_the_setting_is_checked(bad):
    with pytest.raises(ValueError, match="straggler.where_refresh_windows"):
        StragglerConfig(where_refresh_windows=bad).validate()


def _paced(start_s: bool) -> RankHistory:
    """A step-paced 2-rank job: a window with data every 2.5 s. Rank 0 finished 50 ms late in a
    regime that ended 20 s before the onset; quiet since; from the onset (step 20) the link into
    rank 0 is slow (it finishes 40 ms late, rank 1 early by as much: offsets from the 2-rank mean)."""
    rng = np.random.default_rng(1)
    h = RankHistory(64)
    for step in range(24):
        d = 0.05 if step < 12 else 0.04 if step >= 20 else 0.0
        arr, fin = rng.normal(0, 5e-4), d + rng.normal(0, 5e-4)
        f = (_frame([arr, -arr, 0.0, 0.0], [fin, -fin, 0.0, 0.0]).filter(pl.col("rank") < 2))
        h.add(step, f, 1000.0 + 2.5 * step if start_s else None)
    return h


def test_the_pre_onset_span_is_event_time_not_steps():
    # 20 steps before the onset are 50 s of a paced job: they reach into the earlier regime, whose
    # offsets then read as the baseline (step arithmetic, no start times: rank 1 named)
    _, old = locate(_paced(False), "j", [COMM], onset_step=20, now_step=23, window_s=1.0)
    assert old.rank == 1
    _, w = locate(_paced(True), "j", [COMM], onset_step=20, now_step=23, window_s=1.0)
    assert (w.kind, w.rank, w.link) == ("link", 0, (1, 0))


def test_the_onset_step_is_found_by_its_window_start():
    h = _paced(True)
    assert h.step_at(1050.0) == 20 and h.step_at(1049.0) == 20 and h.start_of(20) == 1050.0
    assert h.step_at(2000.0) is None and RankHistory(4).start_of(3) is None


def test_a_window_early_onset_is_judged_while_the_estimate_has_no_instance_yet():
    # the change began in window 25; the CUSUM put the onset at 26, and windows 26-27 hold no
    # complete instance: window 25 is judged as the first post-onset one (rule onset_slack)
    h = _history(25, 27, blind=0)
    for step in (26, 27):
        h.frames = type(h.frames)([(s, f if s != step else _frame([None] * NR, [None] * NR)) for s, f in h.frames],
                                  maxlen=h.frames.maxlen)
    counters: dict = {}
    _, w = locate(h, "j", [COMM], onset_step=26, now_step=27, window_s=1.0, counters=counters)
    assert (w.rank, w.rule) == (2, "late_arrival") and counters["where_onset_slack"] == 1
    # once a window since the estimate holds instances, the estimate stands (no slack)
    h2 = _history(25, 28, blind=0)
    assert locate(h2, "j", [COMM], onset_step=26, now_step=28, window_s=1.0, counters=counters) is not None
    assert counters["where_onset_slack"] == 1
