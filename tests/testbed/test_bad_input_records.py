"""Faults injected into real records (`dynamiccl.harness.bad_input`) and one replayed end to end."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from dynamiccl.harness import bad_input as bi

T = 1_000.0


def _frame(n=40, ranks=3):
    seq = np.repeat(np.arange(n), ranks)
    rank = np.tile(np.arange(ranks), n)
    enq = ((T - 10 + seq * 0.5) * 1e9).astype(np.uint64)
    return pl.DataFrame({"rank": rank.astype(np.int32), "comm_hash": np.full(n * ranks, 7, np.uint64),
                         "seq_number": seq.astype(np.uint64), "enqueue_ns": enq,
                         "gpu_start_ns": np.zeros(n * ranks, np.uint64), "gpu_end_ns": np.zeros(n * ranks, np.uint64),
                         "cpu_end_ns": enq + np.uint64(10**8), "host": [f"h{r}" for r in rank]})


EVENTS = [{"onset_wall": T - 5, "applied_wall": T - 5}, {"onset_wall": T + 5, "applied_wall": T + 5}]


def test_the_quiet_point_is_the_middle_of_the_longest_gap():
    ev = [{"onset_wall": x} for x in (10.0, 20.0, 50.0, 55.0)]
    assert bi.quiet_point(ev) == 35.0
    with pytest.raises(ValueError):
        bi.quiet_point(ev[:1])


def test_pause_moves_everything_after_it_and_the_onsets_with_it():
    df, ev = bi.inject("pause", _frame(), EVENTS, T)
    after = df.filter(pl.col("enqueue_ns") >= int((T + bi.PAUSE_S) * 1e9))
    assert after.height == _frame().filter(pl.col("enqueue_ns") >= int(T * 1e9)).height
    assert [e["onset_wall"] for e in ev] == [T - 5, T + 5 + bi.PAUSE_S]
    assert (df["cpu_end_ns"].cast(pl.Int64) - df["enqueue_ns"].cast(pl.Int64)).unique().to_list() == [10**8]


def test_a_clock_step_moves_one_ranks_times_only():
    base = _frame()
    for fault, sign in (("jump", 1), ("jumpback", -1)):
        df, ev = bi.inject(fault, base, EVENTS, T)
        j = base.join(df, on=["rank", "seq_number"], suffix="_f")
        moved = j.filter(pl.col("enqueue_ns_f") != pl.col("enqueue_ns"))
        assert set(moved["rank"].to_list()) == {1} and ev == EVENTS
        assert ((moved["enqueue_ns_f"].cast(pl.Int64) - moved["enqueue_ns"].cast(pl.Int64)) == sign * int(bi.STEP_S * 1e9)).all()
        assert (moved["enqueue_ns"] >= int(T * 1e9)).all()


def test_vanish_join_and_absurd():
    base = _frame()
    df, _ = bi.inject("vanish", base, EVENTS, T)
    assert df.filter((pl.col("rank") == 1) & (pl.col("enqueue_ns") >= int(T * 1e9))).height == 0
    assert df.height < base.height
    df, _ = bi.inject("absurd", _frame(4000), EVENTS, T, seed=3)
    d = df["cpu_end_ns"].cast(pl.Int64) - df["enqueue_ns"].cast(pl.Int64)
    assert 0 < int((d != 10**8).sum()) < 0.03 * df.height
    df, _ = bi.inject("join", base, EVENTS, T)
    assert df.filter((pl.col("rank") == 1) & (pl.col("enqueue_ns") < int(T * 1e9))).height == 0
    assert df.filter(pl.col("rank") == 1).height > 0
    with pytest.raises(ValueError, match="unknown fault"):
        bi.inject("melt", base, EVENTS, T)


@pytest.mark.slow
def test_a_stepped_clock_on_a_real_run_is_corrected(tmp_path):
    """Dev run 20 (4 ranks): rank 1's clock 5 s ahead from the run's quiet point on. Without the
    collector's clock alignment the replay reported 2 of the 11 labelled changes (11 clean); with
    it, all but at most one, and no false alarm more than the clean replay."""
    from dynamiccl.harness.corpus import load_runs
    run = dict(load_runs(half="dev"))[20]
    clean = bi.replay_run(20, run, "clean", tmp_path)
    step = bi.replay_run(20, run, "jump", tmp_path)
    assert clean.changes == step.changes == 11
    assert step.detected >= clean.detected - 1
    assert step.false_alarms <= clean.false_alarms


@pytest.mark.slow
def test_a_stepped_clock_on_a_two_rank_run_is_corrected(tmp_path):
    """Dev run 18 (2 ranks): rank 1's clock 5 s ahead, or behind, from 54.8 s on. With one peer,
    which clock moved is told by each host's own timeline (rank 1's interval between instances
    grew or shrank by the step): rank 1 is corrected. Uncorrected, the replay reported 7 (ahead)
    and 9 (behind) of the 11 labelled changes (11 clean) with 4 and 2 false alarms more than
    clean; corrected, all 11 and none more."""
    from dynamiccl.harness.corpus import load_runs
    run = dict(load_runs(half="dev"))[18]
    clean = bi.replay_run(18, run, "clean", tmp_path)
    assert clean.changes == 11
    for fault in ("jump", "jumpback"):
        step = bi.replay_run(18, run, fault, tmp_path)
        assert step.changes == clean.changes
        assert step.detected >= clean.detected - 1, (fault, step)
        assert step.false_alarms <= clean.false_alarms, (fault, step)
