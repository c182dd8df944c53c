"""A rank missing from two successive windows that together hold every rank: one straddling instance.

The stream table re-baselines a stream whose communicator lost (or gained) ranks, once the
change holds in two successive windows with data (`StreamTable.update`: a step-paced job's
instance straddling one window's edge leaves a rank out of that window only). A step-paced
job's step can straddle *both* of its windows: on the test bed (corpus dev seed 2, 2 ranks, a
2 s step in 1 s windows) one rank's records of a step fell in the window at 21 s and the
other's in the one at 22 s, so each window showed one of the two ranks; the stream was
re-baselined at 22 s, again at 25 s when both ranks were back, lost its pre-onset warm-up (an
open early alarm's samples) and its warm-up restarted at 1 sample: for 10 steps (20 s) no chart
could judge it, and the throttle at 36 s came inside that blind spell.

Rule (`RankStraddle`, switch ``workload.straddle_union``): a rank-set loss in two successive
windows with data is not a loss when the union of the communicator's ranks over those two
windows is the reference number of ranks (every rank reported, some in each window, each
window short of it). A rank that is really gone is missing from both windows, so the union stays
short of the reference; a rank that joined is not a loss and is left to the rebase.
Counter ``n_straddles``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["RankStraddle"]


class RankStraddle:
    """Per stream: the rank bits of its last window with a rank-set loss; the counter."""

    def __init__(self, capacity: int, enabled: bool = True):
        self.enabled = bool(enabled)
        self.prev = np.zeros(capacity, np.uint64)
        self.n_straddles = 0

    def grow(self, extra: int) -> None:
        self.prev = np.concatenate([self.prev, np.zeros(extra, np.uint64)])

    def split(self, i: np.ndarray, lost_now: np.ndarray, lost: np.ndarray, masks, rref: np.ndarray) -> np.ndarray:
        """``lost`` (streams ``i`` lost ranks in this window and their last one) less the ones
        whose two windows' rank bits together hold ``rref`` ranks. ``masks``: a callable giving
        this window's rank bits per stream (called only when some stream lost ranks)."""
        if not self.enabled or not lost_now.any():
            return lost
        bits = masks()
        count = np.bitwise_count(bits).astype(np.int64)
        before = np.bitwise_count(self.prev[i]).astype(np.int64)
        union = np.bitwise_count(self.prev[i] | bits).astype(np.int64)
        # ranks missing from each window (a loss, not a rank that joined), all there in the two
        straddle = lost & (count > 0) & (before > 0) & (count < rref) & (before < rref) & (union == rref)
        self.prev[i[lost_now]] = bits[lost_now]
        self.n_straddles += int(straddle.sum())
        return lost & ~straddle
