"""The test-bed corpus's false alarms, one row each, for classification (issue: ≤ 1 per monitored hour).

Each run is replayed and scored the way :func:`dynamiccl.harness.corpus.score_run` does (same replay,
same scorer, ``MATCH_S``). For every report the scorer calls false, a row gives

* when: seconds from the run's first labelled onset, and from / to the labelled changes around it;
* what the detector had just done: seconds since its own last recovery report and since its last
  report of any kind (the detector's state, not the labels);
* what the streams did at the report's estimated onset: the largest move of any stream, by the
  scorer's effect measure (:func:`dynamiccl.harness.testbed.effect.moved`; windows from
  max(onset − 20 s, the previous labelled onset) against the 5 s after it, clipped at the next
  labelled onset; nan when fewer than 3 whole windows precede it);
* a first class from the timing alone (:func:`timing_class`), to be read with the streams.

``python -m dynamiccl.harness.corpus_false [--set KEY=VALUE] [--out FILE]``; dev half only (the
evaluation half is scored once, by the lead, never while developing).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import polars as pl

__all__ = ["false_rows", "timing_class", "main"]

PRE_S, POST_S, MIN_PRE = 20.0, 5.0, 3
AFTER_RELEASE_S = 15.0     # "after a release": the span Session 21 saw re-excursions in (3-13 s)
PRECURSOR_S = 5.0          # a report this soon before the next labelled change of its direction


def timing_class(row: dict) -> str:
    """A first class from the report's timing and direction against the labels."""
    if row["why"].startswith("before the first"):
        return "before first change"
    if row["why"].startswith("second report"):
        return "second report"
    if row["why"].startswith("wrong direction"):
        return "wrong direction"
    nxt = row.get("to_next_s")
    if nxt is not None and nxt <= PRECURSOR_S and row["degrades"] == row["next_degrades"]:
        return "precursor"
    if row["degrades"] == row["prev_degrades"] and not row["prev_matched"]:
        return "late first report"
    if row["degrades"] and not row["prev_degrades"] and row["from_prev_s"] <= AFTER_RELEASE_S:
        return "re-excursion after release"
    if not row["degrades"] and row["degrades"] != row["prev_degrades"] and row["prev_matched"]:
        return "late/extra recovery"
    return "other"


def _effect(windows: pl.DataFrame, onset: float, lo: float, hi: float, degrades: bool) -> tuple[float, float]:
    """Largest move (ratio, z) of any stream at ``onset``: windows in [lo, onset) vs [onset, hi)."""
    from dynamiccl.harness.testbed.effect import moved
    best = (float("nan"), float("nan"))
    sel = windows.filter((pl.col("w") >= int(math.floor(lo))) & (pl.col("w") < int(math.ceil(hi))))
    for _, g in sel.group_by("comm_hash", "bytes"):
        w, med = g["w"].to_numpy(), g["med"].to_numpy()
        pre, post = med[(w >= lo) & (w + 1.0 <= onset)], med[(w >= onset) & (w < hi)]
        if len(pre) < MIN_PRE or len(post) < 1:
            continue
        r, z = moved(pre, post, degrades)
        if not best[0] >= r:
            best = (r, z)
    return best


def _detection_row(seed: int, d: dict, why: str, events: list, matched: set[int], reports: list,
                   windows: pl.DataFrame, t0: float) -> dict:
    from dynamiccl.harness.testbed.score import Detection
    det = Detection(**d)
    wall, onset = det.wall_s, det.start_s
    prev = [e for e in events if e.onset_wall <= wall]
    nxt = [e for e in events if e.onset_wall > wall]
    recs = [r.detected_s for r in reports if r.kind == "recovery" and r.detected_s < wall]
    earlier = [r.detected_s for r in reports if r.detected_s < wall]
    row = {"seed": seed, "at_s": round(wall - t0, 1), "kind": det.kind, "step": det.step,
           "magnitude": round(det.magnitude, 2), "ranks": det.ranks, "degrades": det.degrades, "why": why,
           "onset_s": round(onset - t0, 1) if onset == onset else None,
           "since_recovery_s": round(wall - recs[-1], 1) if recs else None,
           "since_report_s": round(wall - earlier[-1], 1) if earlier else None}
    if prev:
        p = prev[-1]
        row.update(prev=f"#{p.index} {p.do}", prev_degrades=p.degrades, prev_matched=p.index in matched,
                   from_prev_s=round(wall - p.onset_wall, 1))
    if nxt:
        n = nxt[0]
        row.update(next=f"#{n.index} {n.do}", next_degrades=n.degrades, to_next_s=round(n.onset_wall - wall, 1))
    if onset == onset:
        lo = max(onset - PRE_S, prev[-1].onset_wall if prev and prev[-1].onset_wall < onset else -np.inf)
        hi = min(onset + POST_S, nxt[0].onset_wall if nxt else np.inf)
        r, z = _effect(windows, onset, lo, hi, det.degrades)
        row.update(effect_ratio=round(r, 2), effect_z=round(z, 1))
    row["class"] = timing_class(row)
    return row


def false_rows(seed: int, run_dir: Path, config=None) -> list[dict]:
    """One row per false alarm of one run (see the module docstring)."""
    from dynamiccl.detector.config import DetectorConfig
    from dynamiccl.harness.corpus import MATCH_S, _relabel
    from dynamiccl.harness.testbed.controller import TruthEvent
    from dynamiccl.harness.testbed.effect import stream_windows
    from dynamiccl.harness.testbed.score import Detection, score
    from dynamiccl.report.replay import replay

    truth = json.loads((run_dir / "truth.json").read_text())
    events = sorted((TruthEvent(**_relabel(e)) for e in truth["events"]), key=lambda e: e.onset_wall)
    res = replay(str(run_dir / "records"), config or DetectorConfig(), window_s=None, retuner=False)
    sc = score(events, [Detection.from_change(rc, rc.detected_s) for rc in res.changes], match_s=MATCH_S)
    matched = {r["index"] for r in sc.rows if r["detected"]}
    windows = stream_windows(run_dir / "records")
    t0 = events[0].onset_wall if events else 0.0
    return [_detection_row(seed, f["detection"], f["why"], events, matched, res.changes, windows, t0)
            for f in sc.false]


def _fmt(r: dict) -> str:
    eff = f"{r.get('effect_ratio')}x z {r.get('effect_z')}" if "effect_ratio" in r else "n/a"
    return (f"| {r['seed']} | {r['at_s']:+.1f} {r['kind']}{' ' + r['step'] if r['step'] else ''} "
            f"{r['magnitude']}x ranks {r['ranks']} | after {r.get('prev', '-')} +{r.get('from_prev_s', '-')} s; "
            f"next {r.get('next', '-')} in {r.get('to_next_s', '-')} s | since own recovery "
            f"{r['since_recovery_s']} s, since report {r['since_report_s']} s | {eff} | {r['class']} |")


def main(argv: list[str] | None = None) -> int:
    from dynamiccl.detector.config import DetectorConfig, parse_overrides
    from dynamiccl.harness import corpus

    ap = argparse.ArgumentParser(prog="python -m dynamiccl.harness.corpus_false")
    ap.add_argument("--corpus", default=str(corpus.DEFAULT_CORPUS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="detector override")
    ap.add_argument("--out", default=None, help="write the rows here (JSON)")
    args = ap.parse_args(argv)
    cfg = DetectorConfig().with_overrides(parse_overrides(args.set))
    rows: list[dict] = []
    for seed, d in corpus.load_runs(args.corpus, "dev"):
        rows += false_rows(seed, d, cfg)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(_fmt(r))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["class"]] = counts.get(r["class"], 0) + 1
    print(f"false_alarms={len(rows)} " + " ".join(f"{k!r}={v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
