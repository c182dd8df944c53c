"""Where `CUSUM()`'s alarms sit relative to the labels of public change-point data (diagnosis).

Scores nothing new: it prints, for one half of the split of benchmarks/public_changepoint.py,
each TCPD series' alarms as (alarm index, `change_start`) beside its labels and its F1 against
never-fire, then classes every RTT alarm by the distance of its `change_start` to the labels
(margin 5, the scorer's): within the margin; early (a label lies inside the excursion, after
the start: an FP plus an FN for the scorer); late (6-20 samples after a label); no label near.

Usage: python benchmarks/public_changepoint_positions.py --tcpd PATH --rtt PATH [--split dev]
       [--set KEY=VALUE ...]
Develop on dev only. The last line is key=value pairs.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import public_changepoint as pc  # noqa: E402

LATE = 20  # a start this many samples after a label counts as late, further as no label near


def position_class(start: int, alarm: int, labels: list[int], margin: int = pc.MARGIN) -> str:
    """Class of an alarm's `change_start` against the labels (module docstring)."""
    if labels and min(abs(start - t) for t in labels) <= margin:
        return "within"
    if any(start < t <= alarm for t in labels):
        return "early"
    if any(0 < start - t <= LATE for t in labels):
        return "late"
    return "none_near"


def tcpd_rows(root: Path, split: str, seed: int) -> list[str]:
    rows = []
    for name, xs, ann in pc.in_split(pc.load_tcpd(root), "tcpd", split, seed):
        alarms = pc.run_cusum(xs)
        f1 = pc.tcpd_f1(ann, [s for _, s in alarms], len(xs))
        never = pc.tcpd_f1(ann, [], len(xs))
        labels = sorted(set().union(*[set(v) for v in ann.values()]))
        rows.append(f"{name:24s} n={len(xs):4d} F1={f1:.3f} never={never:.3f} "
                    f"alarms={alarms} labels={labels}")
    return rows


def rtt_classes(root: Path, split: str, seed: int) -> Counter:
    counts: Counter = Counter()
    for _, xs, cps in pc.in_split(pc.load_rtt(root), "rtt", split, seed):
        for alarm, start in pc.run_cusum(xs):
            counts[position_class(start, alarm, cps)] += 1
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tcpd", type=Path, required=True)
    ap.add_argument("--rtt", type=Path, required=True)
    ap.add_argument("--split", choices=("dev", "eval"), default="dev")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    pc.CUSUM_KWARGS.update(pc._parse_set(ap, args.set))
    for row in tcpd_rows(args.tcpd, args.split, args.seed):
        print(row)
    counts = rtt_classes(args.rtt, args.split, args.seed)
    print(" ".join(f"rtt_{c}={counts[c]}" for c in ("within", "early", "late", "none_near"))
          + f" rtt_alarms={sum(counts.values())} split={args.split}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
