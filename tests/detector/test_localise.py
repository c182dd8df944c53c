"""localise: a late-arriving rank is named as a rank, a late-finishing one as the link into it."""
import numpy as np
import polars as pl

from dynamiccl.detector.localise import localise

ONSET = 1000.0


def records(n=3, *, late_arrival=None, late_finish=None, shift_s=0.02, clock_offset_s=(0.0, 5.0, -3.0), seed=0):
    """One all-reduce every 20 ms for 40 s; after ONSET one rank arrives or finishes ``shift_s`` late.
    Each rank's clock has a constant offset (no cross-host sync): it must cancel."""
    rng = np.random.default_rng(seed)
    rows = []
    for seq, t in enumerate(np.arange(ONSET - 25, ONSET + 15, 0.02)):
        after = t >= ONSET
        for r in range(n):
            arr = t + rng.normal(0, 5e-4) + (shift_s if after and r == late_arrival else 0.0)
            rows.append((r, n, 1, seq, arr, r))
        last = max(x[4] for x in rows[-n:])
        for i in range(n):
            r = rows[-n + i][0]
            fin = last + 0.01 + rng.normal(0, 5e-4) + (shift_s if after and r == late_finish else 0.0)
            rows[-n + i] = rows[-n + i][:5] + (fin,)
    off = clock_offset_s
    return pl.DataFrame({"rank": [x[0] for x in rows], "nranks": [x[1] for x in rows],
                         "comm_hash": [x[2] for x in rows], "seq_number": [x[3] for x in rows],
                         "enqueue_ns": [int((x[4] + off[x[0]]) * 1e9) for x in rows],
                         "end_ns": [int((x[5] + off[x[0]]) * 1e9) for x in rows]},
                        schema_overrides={"rank": pl.Int32, "nranks": pl.Int32, "comm_hash": pl.UInt64,
                                          "seq_number": pl.UInt64})


def test_late_arrival_names_the_rank():
    w = localise(records(late_arrival=2), onset_s=ONSET, detected_s=ONSET + 2)
    assert w is not None and (w.kind, w.rank, w.rule) == ("rank", 2, "late_arrival")
    assert w.confidence > 0.8


def test_late_finish_names_the_link_into_the_rank():
    w = localise(records(late_finish=1), onset_s=ONSET, detected_s=ONSET + 2)
    assert w is not None and (w.kind, w.rank, w.link) == ("link", 1, (2, 1))  # gloo's ring: 2 sends to 1


def test_a_job_wide_change_names_nobody():
    assert localise(records(), onset_s=ONSET, detected_s=ONSET + 2) is None


def test_no_records_around_the_onset_is_no_verdict():
    assert localise(records(), onset_s=ONSET + 500, detected_s=ONSET + 502) is None
