"""After a run: where each change's detection delay went, and offline replays of its windows.

A run's output directory holds everything needed: ``truth.json``, ``detections.ndjson``,
``windows_keys.parquet`` / ``windows_ranks.parquet`` (and ``windows_waits.parquet`` where there were wait
streams; every feature window with the wall time
it reached the detector, ``received_wall_s``) and ``records/`` (every raw record, parquet).

:func:`decompose` splits each detected change's delay into the stages it went through::

    onset (just before ``tc``)
      → first affected collective (the first record started after the onset whose duration is
        past the midpoint, in log scale, between the old and the new level of its size: for a
        degradation slower, for a recovery faster; "slow" for short)
      → that record's window closed (reached the detector: lateness, the slowest rank's next
        record, the source's flush, transport)
      → the detector fired (on the window ending at ``detected_s``, confirmation windows)
      → emitted (``wall_s``; a run's ``detections.ndjson``)

:func:`replay` feeds the saved windows to a fresh :class:`~dynamiccl.detector.service.Detector` with other
settings and scores it as if live (a detection's wall time = when its window had reached the
live detector) — for choosing the test bed's detector settings without a new run; the result
depends on the detector code at replay time.

``python -m dynamiccl.harness.testbed.analyse RUN_DIR [--set group.name=value ...]`` prints both.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from dynamiccl.detector.config import parse_overrides
from dynamiccl.loop import Loop

__all__ = ["load_windows", "decompose", "replay", "machine_noise", "main"]


def _truth(run_dir: Path):
    from dynamiccl.harness.testbed.controller import TruthEvent
    raw = json.loads((run_dir / "truth.json").read_text())
    fields = TruthEvent.__dataclass_fields__
    return [TruthEvent(**{k: v for k, v in e.items() if k in fields}) for e in raw["events"]]


def load_windows(run_dir: Path) -> list[tuple]:
    """[(WindowFeatures, received_wall_s)] in window order, from the run's parquet files."""
    import polars as pl

    from dynamiccl.collector.features import WindowFeatures
    frames = {}
    for part in ("keys", "ranks", "waits"):
        path = run_dir / f"windows_{part}.parquet"
        frames[part] = pl.read_parquet(path) if path.exists() else pl.DataFrame()
    starts = sorted({ws for part in ("keys", "ranks") if frames[part].height
                     for ws in frames[part]["window_start"].to_list()})
    by = {part: {k[0]: g for k, g in df.group_by("window_start")} if df.height else {}
          for part, df in frames.items()}
    out = []
    for ws in starts:
        k, r = by["keys"].get(ws), by["ranks"].get(ws)
        ref = k if k is not None else r
        window_s = float(ref["window_s"][0])
        received = float(ref["received_wall_s"][0]) if "received_wall_s" in ref.columns else math.nan
        drop = [c for c in ("window_start", "window_s", "received_wall_s") if c in ref.columns]
        keys = k.drop(drop) if k is not None else frames["keys"].drop(drop).clear()
        ranks = r.drop(drop) if r is not None else frames["ranks"].drop(
            [c for c in drop if c in frames["ranks"].columns]).clear()
        w = by["waits"].get(ws)
        waits = w.drop([c for c in ("window_start", "window_s", "received_wall_s") if c in w.columns]) \
            if w is not None else None
        out.append((WindowFeatures(float(ws), window_s, keys, ranks, {}, waits), received))
    return out


def _records(run_dir: Path):
    import polars as pl
    files = sorted((run_dir / "records").rglob("*.parquet"))
    if not files:
        return None
    df = pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed")
    return (df.filter(pl.col("timing_source") == 2)
              .with_columns((pl.col("enqueue_ns") / 1e9).alias("start_s"),
                            (pl.col("cpu_end_ns") / 1e9).alias("end_s"),
                            ((pl.col("cpu_end_ns") - pl.col("enqueue_ns")) / 1e9).alias("dur_s"))
              .sort("start_s"))


def _level(rec, size: int, lo: float, hi: float) -> float:
    import polars as pl
    s = rec.filter((pl.col("bytes") == size) & (pl.col("start_s") >= lo) & (pl.col("start_s") < hi))["dur_s"]
    return float(s.median()) if len(s) else math.nan


def decompose(run_dir: Path, *, settle_s: float = 2.0) -> list[dict]:
    """One row per truth change (see the module docstring); times in seconds after the onset."""
    import polars as pl
    run_dir = Path(run_dir)
    events = _truth(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = {r["index"]: r for r in summary["score"]["rows"]}
    rec = _records(run_dir)
    windows = load_windows(run_dir)
    closes = [(wf.window_start, wf.window_s, received) for wf, received in windows]
    out = []
    for i, e in enumerate(events):
        on = e.onset_wall
        nxt = events[i + 1].onset_wall if i + 1 < len(events) else on + 7.0
        row = {"index": e.index, "description": e.description, "delay_s": None}
        hit = rows.get(e.index, {})
        first = None
        if rec is not None:
            best = None
            for size in sorted(rec["bytes"].unique().to_list()):
                before = _level(rec, size, on - 5.0, on)
                after = _level(rec, size, on + settle_s, nxt)
                if not (before > 0 and after > 0) or abs(math.log(after / before)) < math.log(1.2):
                    continue
                mid = math.sqrt(before * after)
                cand = rec.filter((pl.col("bytes") == size) & (pl.col("start_s") >= on) & (pl.col("start_s") < nxt))
                cand = cand.filter(pl.col("dur_s") > mid) if after > before else cand.filter(pl.col("dur_s") < mid)
                if cand.height and (best is None or cand["end_s"][0] < best["end_s"]):
                    best = cand.row(0, named=True)
            first = best
        if first is not None:
            row["first_affected_start_s"] = round(first["start_s"] - on, 3)
            row["first_affected_end_s"] = round(first["end_s"] - on, 3)
            for ws, w, received in closes:
                if ws <= first["start_s"] < ws + w:
                    row["its_window_end_s"] = round(ws + w - on, 3)
                    row["its_window_closed_s"] = round(received - on, 3)
                    break
        if hit.get("detected"):
            det_end = on + hit["event_delay_s"]
            row["detector_window_end_s"] = round(det_end - on, 3)
            for ws, w, received in closes:
                if abs(ws + w - det_end) < 0.01:  # event_delay_s is rounded to ms
                    row["detector_window_closed_s"] = round(received - on, 3)
            row["delay_s"] = hit["delay_s"]
            row["kind"] = hit["kind"]
        out.append(row)
    return out


def machine_noise(run_dir: Path, *, stall_ratio: float = 1.25) -> dict:
    """How noisy the machine was, from the run's own windows in its quiet spans — the warm-up the
    detector saw (its baseline) and 2-6.5 s after each release / bulk off (no change scripted
    there; the truth timeline says where): each stream's log p50 off its median in that span.
    ``stall_share`` is the share of (window, stream) values more than ``stall_ratio`` x off (a
    collective-wide stall or a preempted rank), ``sigma`` their robust σ (1.4826 MAD); measured:
    stall share 0-0.9 % on a quiet machine (load < 1), 3-7 % at load 6-10, 18-35 % at load 12-18."""
    import numpy as np
    import polars as pl
    run_dir = Path(run_dir)
    events = _truth(run_dir)
    try:
        detect_from = float(json.loads((run_dir / "summary.json").read_text()).get("detect_from", -math.inf))
    except (OSError, ValueError):
        detect_from = -math.inf
    spans = [(detect_from, min(e.onset_wall for e in events))] + [
        (e.onset_wall + 2.0, e.onset_wall + 6.5) for e in events if not e.degrades]
    k = pl.read_parquet(run_dir / "windows_keys.parquet").filter(
        pl.col("lat_p50_s").is_not_null() & (pl.col("lat_p50_s") > 0))
    devs, windows = [], 0
    for lo, hi in spans:
        w = k.filter((pl.col("window_start") >= lo) & (pl.col("window_start") + pl.col("window_s") <= hi))
        if w.height == 0:
            continue
        windows += w["window_start"].n_unique()
        devs.append(w.select((pl.col("lat_p50_s").log() - pl.col("lat_p50_s").log().median()
                              .over("comm_hash", "func", "size_bucket")).alias("d"))["d"].to_numpy())
    dev = np.concatenate(devs) if devs else np.zeros(0)
    if dev.size == 0:
        return {"windows": 0, "stall_share": math.nan, "sigma": math.nan}
    return {"windows": int(windows),
            "stall_share": round(float(np.mean(np.abs(dev) > math.log(stall_ratio))), 4),
            "sigma": round(1.4826 * float(np.median(np.abs(dev - np.median(dev)))), 4)}


def _detect_span(run_dir: Path) -> tuple[float, float]:
    """The event times whose windows the live run gave the detector (``summary.json``'s
    ``detect_from`` / ``detect_until``). Runs recorded before ``detect_until`` existed: the end
    of their built-in scenario's timeline (its windows after that are the job's shutdown)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return -math.inf, math.inf
    lo = float(summary.get("detect_from", -math.inf))
    hi = summary.get("detect_until")
    if hi is None:
        from dynamiccl.harness.testbed.scenario import BUILTIN, builtin
        hi = math.inf
        if summary.get("scenario") in BUILTIN:
            sc, events = builtin(summary["scenario"]), _truth(run_dir)
            if events:
                hi = events[0].onset_wall - events[0].at_s + sc.duration_s - sc.warmup_s
    return lo, float(hi)


def replay(run_dir: Path, **overrides):
    """Score the run's saved windows through a fresh detector with ``overrides`` on top of the
    test bed's settings; returns the :class:`~dynamiccl.harness.testbed.score.Score`."""
    from dynamiccl.harness.testbed.detect import LiveDetector
    from dynamiccl.harness.testbed.score import score
    windows = load_windows(Path(run_dir))
    detect_from, detect_until = _detect_span(Path(run_dir))
    windows = [(wf, r) for wf, r in windows
               if wf.window_start >= detect_from and wf.window_start + wf.window_s <= detect_until]
    clock = {"now": 0.0}
    det = LiveDetector(windows[0][0].window_s if windows else 0.5, clock=lambda: clock["now"], **overrides)
    detections, loop = [], Loop(det)
    for wf, received in windows:
        clock["now"] = received
        detections += loop.step(wf).changes
    return score(_truth(Path(run_dir)), detections)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="detector setting by dotted key for the replay (repeatable), e.g. fusion.min_ratio=1.1")
    args = ap.parse_args(argv)
    overrides = parse_overrides(args.set)
    cols = ("first_affected_start_s", "first_affected_end_s", "its_window_end_s", "its_window_closed_s",
            "detector_window_end_s", "detector_window_closed_s", "delay_s")  # column titles: minus "_s"
    print("seconds after the onset (see the module docstring):")
    print(f"{'change':<36} {'kind':<10} " + " ".join(f"{c[:-2]:>14}" for c in cols))
    for row in decompose(args.run_dir):
        print(f"{row['description']:<36} {row.get('kind', 'MISSED'):<10} "
              + " ".join(f"{row.get(c) if row.get(c) is not None else '-':>14}" for c in cols))
    sc = replay(args.run_dir, **overrides)
    print(f"replay {overrides or '(test bed settings)'}: {sc.line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
