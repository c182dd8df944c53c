"""The position classes of benchmarks/public_changepoint_positions.py on hand-made alarms:
a `change_start` within the scorer's ±5 margin, early (a label inside the excursion), late
(6-20 after a label), or with no label near."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(_DIR))
_spec = importlib.util.spec_from_file_location("public_changepoint_positions",
                                               _DIR / "public_changepoint_positions.py")
pos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pos)


def test_position_classes():
    labels = [100, 300]
    assert pos.position_class(95, 120, labels) == "within"  # 5 off: inside the margin
    assert pos.position_class(91, 120, labels) == "early"  # label 100 inside (91, 120]
    assert pos.position_class(91, 99, labels) == "none_near"  # the alarm precedes the label
    assert pos.position_class(106, 130, labels) == "late"  # 6 after a label
    assert pos.position_class(121, 140, labels) == "none_near"  # 21 after: not late any more
    assert pos.position_class(50, 60, []) == "none_near"
