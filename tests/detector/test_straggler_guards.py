"""A rank named by the shortest-counts must also be shorter than its peers where durations are known.

On a 2-rank communicator (a data-parallel pair) the counts alone decide unless the durations
corroborate: a job-wide slowdown leaves both ranks' duration ratios at 1, a straggler's own ratio falls.
"""
from __future__ import annotations

import polars as pl

from dynamiccl.collector.features import RANKS_SCHEMA
from dynamiccl.detector.straggler import STRAGGLER_REL_Z, RankHistory, find_stragglers


def _frame(counts, rel):
    n = len(counts)
    return pl.DataFrame({"job_id": ["j"] * n, "comm_hash": [7] * n, "rank": list(range(n)),
                         "host": [f"h{r}" for r in range(n)], "records": [40] * n,
                         "lat_mean_s": [1e-3] * n, "rel_lat_mean": list(rel),
                         "shortest_count": list(counts), "instances_complete": [40] * n}, schema=RANKS_SCHEMA)


def _history(after_counts, after_rel):
    h = RankHistory(16)
    quiet = [([20, 20], (1.01, 0.99)), ([21, 19], (0.99, 1.01)), ([19, 21], (1.0, 1.0))] * 3
    for step, (counts, rel) in enumerate(quiet + [(after_counts, after_rel)]):
        h.add(step, _frame(counts, rel))
    return h, len(quiet)


def test_a_pair_slowed_alike_names_no_straggler_when_durations_are_known():
    h, onset = _history([32, 8], (1.0, 1.0))
    assert [c.rank for c in find_stragglers(h, "j", [7], onset_step=onset)] == [0]      # counts alone
    assert find_stragglers(h, "j", [7], onset_step=onset, rel_z=STRAGGLER_REL_Z) == []


def test_a_pair_with_a_late_rank_still_names_it():
    h, onset = _history([32, 8], (0.7, 1.0 / 0.7))
    got = find_stragglers(h, "j", [7], onset_step=onset, rel_z=STRAGGLER_REL_Z)
    assert [(c.rank, c.rule) for c in got] == [(0, "counts")]


def _wide(counts_by_rank: dict[int, int], n: int = 800):
    counts = [counts_by_rank.get(r, 0) for r in range(n)]
    return pl.DataFrame({"job_id": ["j"] * n, "comm_hash": [9] * n, "rank": list(range(n)),
                         "host": [f"h{r // 8}" for r in range(n)], "records": [30] * n,
                         "lat_mean_s": [1e-3] * n, "rel_lat_mean": [None] * n,
                         "shortest_count": counts, "instances_complete": [30] * n}, schema=RANKS_SCHEMA)


def test_one_shortest_instance_among_800_ranks_is_no_straggler():
    """29 instances, each won by a different rank of 800: z = 5.2 for each, but any rank draws one."""
    h = RankHistory(8)
    h.add(0, _wide({r: 1 for r in range(0, 800, 20)}))          # before: 40 instances, spread
    h.add(1, _wide({r: 1 for r in range(3, 800, 28)}))          # after: 29 ranks tied at one each
    assert find_stragglers(h, "j", [9], onset_step=1) == []


def test_a_rank_shortest_in_ten_of_149_among_800_is_named():
    h = RankHistory(8)
    h.add(0, _wide({r: 1 for r in range(0, 800, 20)}))
    after = {r: 1 for r in range(1, 800, 6)}                     # 134 instances spread over ranks
    after[444] = 10
    h.add(1, _wide(after))
    assert [(c.rank, c.rule) for c in find_stragglers(h, "j", [9], onset_step=1)] == [(444, "partial")]
