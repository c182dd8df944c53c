"""Live localisation from the windows' per-rank offsets (`dynamiccl.detector.where`)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from dynamiccl.collector.features import RANKS_OPTIONAL, RANKS_SCHEMA, WindowFeatures, decode_line, empty_keys, encode_line
from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.events import RegimeChange
from dynamiccl.detector.feature_decode import _fast as fast_decode
from dynamiccl.detector.service import Detector
from dynamiccl.detector.straggler import RankHistory
from dynamiccl.detector.where import locate

COMM = 0xABC
NR = 4


def _frame(arr: list[float], fin: list[float]) -> pl.DataFrame:
    base = pl.DataFrame({"job_id": ["j"] * NR, "comm_hash": [COMM] * NR, "rank": list(range(NR)),
                         "host": [f"h{r}" for r in range(NR)], "records": [10] * NR,
                         "lat_mean_s": [0.01] * NR, "rel_lat_mean": [1.0] * NR,
                         "shortest_count": [0] * NR, "instances_complete": [10] * NR}, schema=RANKS_SCHEMA)
    return base.with_columns(pl.Series("arr_off_s", arr, pl.Float64), pl.Series("fin_off_s", fin, pl.Float64))


def _history(onset: int, n: int, late: dict[int, tuple[float, float]], seed: int = 0) -> RankHistory:
    """Per-rank offsets with 0.2 ms jitter; from ``onset`` on, rank r's offsets move by late[r]."""
    rng = np.random.default_rng(seed)
    h = RankHistory(64)
    for step in range(n):
        arr = rng.normal(0, 2e-4, NR)
        fin = rng.normal(0, 2e-4, NR)
        if step >= onset:
            for r, (da, df) in late.items():
                arr[r] += da
                fin[r] += df
        h.add(step, _frame(arr.tolist(), fin.tolist()))
    return h


def test_late_arrival_names_the_rank():
    h = _history(25, 30, {2: (0.030, 0.028)})
    comm, w = locate(h, "j", [COMM], onset_step=25, now_step=29, window_s=1.0)
    assert comm == COMM and (w.kind, w.rank, w.rule) == ("rank", 2, "late_arrival")


def test_late_finish_names_the_link_into_the_rank():
    h = _history(25, 30, {1: (0.0, 0.040)})
    _, w = locate(h, "j", [COMM], onset_step=25, now_step=29, window_s=1.0)
    assert (w.kind, w.rank, w.link) == ("link", 1, (2, 1))


def test_job_wide_change_and_missing_history_give_no_verdict():
    assert locate(_history(25, 30, {}), "j", [COMM], onset_step=25, now_step=29, window_s=1.0) is None
    # fewer than MIN_PRE_WINDOWS windows before the onset, or no history at all
    assert locate(_history(2, 5, {3: (0.03, 0.03)}), "j", [COMM], onset_step=2, now_step=4, window_s=1.0) is None
    assert locate(RankHistory(8), "j", [COMM], onset_step=2, now_step=4, window_s=1.0) is None


def _change(kind: str, ranks: list[int]) -> RegimeChange:
    return RegimeChange(id="rc-j-1", kind=kind, job_id="j", start_s=1025.0, detected_s=1030.0, magnitude=2.0,
                        comms=[f"0x{COMM:016x}"], ranks=ranks)


@pytest.mark.parametrize("kind,before,after", [("bandwidth", [], [2]), ("straggler", [1], [1]), ("recovery", [], [])])
def test_detector_puts_the_verdict_first(kind, before, after):
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    det.ranks = _history(25, 30, {2: (0.030, 0.028)})
    out = det._locate(_change(kind, before), step=29, window_start=1029.0, window_s=1.0)
    assert out.ranks[:1] == after[:1]
    assert ("where" in out.evidence) == (kind != "recovery")


def test_a_straggler_keeps_its_rank_against_a_link_verdict():
    det = Detector(DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)))
    det.ranks = _history(25, 30, {1: (0.0, 0.040)})
    out = det._locate(_change("straggler", [3]), step=29, window_start=1029.0, window_s=1.0)
    assert out.ranks == [3] and out.evidence["where"]["kind"] == "link"


def test_offsets_survive_both_decoders_and_old_lines_still_decode():
    ranks = _frame([0.001, -0.001, 0.0, 0.0], [0.0, 0.0, 0.002, -0.002])
    wf = WindowFeatures(10.0, 1.0, empty_keys(), ranks, {})
    line = encode_line(wf)
    for dec in (decode_line, fast_decode):
        got = dec(line)
        assert got.ranks.columns == [*RANKS_SCHEMA, *RANKS_OPTIONAL]
        assert got.ranks["fin_off_s"].to_list() == [0.0, 0.0, 0.002, -0.002]
    old = encode_line(WindowFeatures(10.0, 1.0, empty_keys(), ranks.select(list(RANKS_SCHEMA)), {}))
    for dec in (decode_line, fast_decode):
        assert dec(old).ranks.columns == list(RANKS_SCHEMA)
