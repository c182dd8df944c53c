"""The first class `dynamiccl.harness.corpus_false` gives a false alarm from its timing alone."""
from __future__ import annotations

from dynamiccl.harness.corpus_false import AFTER_RELEASE_S, PRECURSOR_S, timing_class


def _row(**kw):
    row = {"why": "12.0s after change 3", "degrades": True, "prev_degrades": False, "prev_matched": True,
           "from_prev_s": AFTER_RELEASE_S - 1, "to_next_s": PRECURSOR_S + 5, "next_degrades": True}
    row.update(kw)
    return row


def test_the_scorers_own_reasons_come_first():
    assert timing_class(_row(why="before the first change")) == "before first change"
    assert timing_class(_row(why="second report of change 2")) == "second report"
    assert timing_class(_row(why="wrong direction for change 4 (release)")) == "wrong direction"


def test_a_degradation_after_a_release():
    assert timing_class(_row()) == "re-excursion after release"
    assert timing_class(_row(from_prev_s=AFTER_RELEASE_S + 1)) == "other"


def test_a_report_just_before_the_next_change_of_its_direction_is_a_precursor():
    assert timing_class(_row(to_next_s=PRECURSOR_S - 1)) == "precursor"
    assert timing_class(_row(to_next_s=PRECURSOR_S - 1, next_degrades=False)) == "re-excursion after release"


def test_a_report_of_the_direction_of_an_unreported_change_is_a_late_first_report():
    assert timing_class(_row(prev_degrades=True, prev_matched=False)) == "late first report"
    assert timing_class(_row(degrades=False, prev_degrades=True, prev_matched=True)) == "late/extra recovery"
