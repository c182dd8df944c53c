"""Straggler candidates come out in one order whatever the row order of the ranks frame: tied
candidates (one rank shortest on several of its communicators) used to follow polars'
group_by order, so two runs on the same records could name the communicators differently."""
from __future__ import annotations

import polars as pl

from dynamiccl.detector.straggler import _candidates


def _frame(n_comms: int = 12) -> pl.DataFrame:
    rows = []
    for c in range(1, n_comms + 1):
        for r in range(4):
            rows.append({"job_id": "j", "comm_hash": c * 7919, "rank": r, "host": f"h{r}",
                         "shortest_count": 40 if r == 1 else 0, "records": 40})
    return pl.DataFrame(rows)


def test_tied_candidates_do_not_depend_on_row_order():
    df = _frame()
    want = [(c.comm_hash, c.rank) for c in _candidates(df, {}, {}, share=0.6, min_instances=3,
                                                        z_min=3.0, rel_z=None)]
    assert len(want) == 12
    for seed in range(20):
        got = [(c.comm_hash, c.rank) for c in _candidates(df.sample(fraction=1.0, shuffle=True, seed=seed), {}, {},
                                                           share=0.6, min_instances=3, z_min=3.0, rel_z=None)]
        assert got == want, seed
