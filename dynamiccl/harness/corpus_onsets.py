"""Do the test-bed corpus's labelled changes begin when their onsets say? (issue 17's scorer)

A report up to 5 s before a labelled change of its direction is a false alarm to the scorer (the
"precursor" class of :mod:`dynamiccl.harness.corpus_false`). If the test bed's changes began
before their onsets were stamped, those reports would be early detections, not false alarms.

The profile answers from the records alone, no detector: for each labelled degradation, the median
log duration (CPU end minus enqueue) of all the run's records in each 1 s window from ``BEFORE``
seconds before the onset to ``AFTER`` seconds after it, minus the median of the reference span
``REF`` (15 to 8 s before the onset; a change with fewer than ``MIN_REF`` records there is left
out). Per kind of change (``do``): the median of those differences over the changes, per window,
and the share of changes whose window sits more than ``HIGH`` (1.35x) above the reference.
Labels on time show no rise before 0 and the shift from window 0 on.

A second table says what each labelled change (both directions) moved, still from the records
alone: its collectives' latency (the scorer's effect label, :mod:`dynamiccl.harness.testbed.effect`)
and the job's rate of collective instances (instances per second in the ``RATE_AFTER`` span after
the onset against the ``RATE_BEFORE`` seconds before it, moved when more than ``RATE_MOVE`` either
way). A change that moves the rate and not the latency (a throttle on the link a DDP-like step
loads its batch over, before its all-reduces) is one a latency detector cannot see.

``python -m dynamiccl.harness.corpus_onsets [--half dev] [--corpus PATH]``; the last line is
``key=value`` pairs (per kind: the largest median rise before the onset and the median shift in
window 0). Run it on the dev half while developing (the lead scores the evaluation half once).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import polars as pl

__all__ = ["onset_rows", "profile", "rate_shift", "visibility", "BEFORE", "AFTER", "REF", "HIGH", "main"]

BEFORE, AFTER = 8, 6          # windows (1 s) before and from the onset
REF = (-15.0, -8.0)           # the reference span, seconds from the onset
MIN_REF = 5                   # records the reference needs
HIGH = float(np.log(1.35))    # "above the run's level": more than 1.35x its reference
RATE_BEFORE = 8.0             # seconds of instances before the onset
RATE_AFTER = (0.5, 4.5)       # ... and after it (the first half second is the change settling)
RATE_MOVE = float(np.log(1.25))


def onset_rows(run_dir: Path) -> list[tuple[str, np.ndarray]]:
    """One ``(do, shifts)`` per labelled degradation of one run: ``shifts`` is the window medians'
    log difference from the reference, windows ``-BEFORE .. AFTER - 1`` (NaN where empty)."""
    truth = json.loads((run_dir / "truth.json").read_text())
    rec = pl.read_parquet(run_dir / "records", columns=["enqueue_ns", "cpu_end_ns"])
    ts = rec["enqueue_ns"].to_numpy() / 1e9
    dur = (rec["cpu_end_ns"].to_numpy().astype(np.float64) - rec["enqueue_ns"].to_numpy()) / 1e9
    ok = dur > 0                      # untimed or broken records say nothing about latency
    ts, logd = ts[ok], np.log(dur[ok])
    out = []
    for e in truth["events"]:
        if not e["degrades"]:
            continue
        on = e["onset_wall"]
        ref = logd[(ts >= on + REF[0]) & (ts < on + REF[1])]
        if ref.size < MIN_REF:
            continue
        level = np.median(ref)
        shifts = np.full(BEFORE + AFTER, np.nan)
        for i, k in enumerate(range(-BEFORE, AFTER)):
            w = logd[(ts >= on + k) & (ts < on + k + 1)]
            if w.size:
                shifts[i] = np.median(w) - level
        out.append((e["do"], shifts))
    return out


def rate_shift(starts_s: np.ndarray, onset: float) -> float:
    """log(rate before / rate after) of instances starting at ``starts_s`` around ``onset``
    (positive: fewer instances a second after it); NaN when either span has none."""
    before = np.count_nonzero((starts_s >= onset - RATE_BEFORE) & (starts_s < onset)) / RATE_BEFORE
    lo, hi = RATE_AFTER
    after = np.count_nonzero((starts_s >= onset + lo) & (starts_s < onset + hi)) / (hi - lo)
    return float(np.log(before / after)) if before > 0 and after > 0 else float("nan")


def visibility(run_dir: Path) -> list[dict]:
    """One row per labelled change of one run: ``do``, ``latency`` (the effect label moved),
    ``rate`` (the instance rate moved by more than ``RATE_MOVE``) and ``rate_shift``."""
    from dynamiccl.harness.corpus import _relabel
    from dynamiccl.harness.testbed.controller import TruthEvent
    from dynamiccl.harness.testbed.effect import label_run
    truth = json.loads((run_dir / "truth.json").read_text())
    events = sorted((TruthEvent(**_relabel(e)) for e in truth["events"]), key=lambda e: e.onset_wall)
    rec = pl.read_parquet(run_dir / "records", columns=["comm_hash", "seq_number", "enqueue_ns"])
    starts = (rec.group_by("comm_hash", "seq_number").agg(pl.col("enqueue_ns").min())
                 .get_column("enqueue_ns").to_numpy() / 1e9)
    out = []
    for e, eff in zip(events, label_run(events, run_dir / "records")):
        shift = rate_shift(starts, e.onset_wall)
        out.append({"do": e.do, "latency": bool(eff.effective), "rate": bool(abs(shift) > RATE_MOVE),
                    "rate_shift": shift})
    return out


def profile(rows: list[tuple[str, np.ndarray]]) -> dict[str, dict]:
    """Per kind: ``n``, per-window ``median`` shift and ``high`` share (see the module)."""
    kinds: dict[str, list[np.ndarray]] = {}
    for do, shifts in rows:
        kinds.setdefault(do, []).append(shifts)
    out = {}
    for do, lst in sorted(kinds.items()):
        a = np.vstack(lst)
        seen = np.isfinite(a)
        with np.errstate(invalid="ignore"):
            high = np.where(seen, a > HIGH, False).sum(axis=0) / np.maximum(seen.sum(axis=0), 1)
        out[do] = {"n": len(lst), "median": np.nanmedian(a, axis=0), "high": high}
    return out


def main(argv: list[str] | None = None) -> int:
    from dynamiccl.harness import corpus

    ap = argparse.ArgumentParser(prog="python -m dynamiccl.harness.corpus_onsets")
    ap.add_argument("--corpus", default=str(corpus.DEFAULT_CORPUS))
    ap.add_argument("--half", choices=("dev", "eval"), default="dev")
    args = ap.parse_args(argv)
    runs = [Path(d) for _, d in corpus.load_runs(args.corpus, args.half)]   # the archive unpacked once
    rows = [r for d in runs for r in onset_rows(d)]
    prof = profile(rows)
    keys = []
    for do, p in prof.items():
        cells = " ".join(f"{k:+d}:{m:+.2f}/{h:.0%}" for k, m, h in zip(range(-BEFORE, AFTER), p["median"], p["high"]))
        print(f"{do} (n={p['n']}) window: median log shift / share above 1.35x: {cells}")
        keys.append(f"{do}_max_before={np.nanmax(p['median'][:BEFORE]):.3f} {do}_at_onset={p['median'][BEFORE]:.3f}")
    vis = [v for d in runs for v in visibility(d)]
    both = sum(v["latency"] and v["rate"] for v in vis)
    lat = sum(v["latency"] and not v["rate"] for v in vis)
    rate = sum(v["rate"] and not v["latency"] for v in vis)
    print(f"{len(vis)} labelled changes: latency and rate moved {both}, latency only {lat}, rate only {rate}, "
          f"neither {len(vis) - both - lat - rate}")
    keys.append(f"changes={len(vis)} moved_both={both} latency_only={lat} rate_only={rate}")
    print(f"half={args.half} " + " ".join(keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
