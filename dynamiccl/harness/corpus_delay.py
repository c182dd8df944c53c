"""Where a reported change's delay goes, on the test-bed corpus (issue 17: median delay <= 2 s).

Each run is replayed the way :func:`dynamiccl.harness.corpus.score_run` does (same replay, same
scorer); the detector's stream alarms are recorded per window. A matched change's delay
(``detected_s - onset_wall``) is split at four points:

* ``apply``: onset (taken before the first ``tc`` command) -> the change in place (``applied_wall``);
* ``close``: in place -> the end of the window holding that instant (the window must close);
* ``cusum``: that window's end -> the end of the first window in which a stream of the job alarmed in
  the change's direction (statistic accumulation; 0 when the first affected window alarms);
* ``fusion``: that alarm window's end -> ``detected_s`` (confirmation windows and the gates that
  hold a report). A recovery is emitted by tracking, not by an alarm: its ``cusum`` part is the
  whole span from the window's end to the report and ``fusion`` is 0.

Times are event seconds; the test bed's ranks share the host clock. The parts add up to the delay.

``python -m dynamiccl.harness.corpus_delay [--half dev] [--window S] [--out FILE]``; never run it on
the evaluation half while developing (the lead scores that half once).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["decompose_run", "split_delay", "summarise_parts", "main"]

PARTS = ("apply", "close", "cusum", "fusion")


class _AlarmLog:
    """Wraps a `Detector`'s fusion stage to record, per window, the window's end and the
    directions its streams alarmed in (any job: the test bed runs one job per run)."""

    def __init__(self, det):
        self.det = det
        self.windows: list[tuple[float, set[int]]] = []
        self.window_s = 1.0
        self.with_data: list[bool] = []     # the window held a value of some stream
        self.holds: list[set[str]] = []     # the fusion counters a window moved, "pending" for a held group
        inner = det.fusion.process
        fusion = det.fusion

        def process(ws, window_s, ae=None):
            dirs = set(np.unique(ws.direction).astype(int).tolist()) if ws.fired.size else set()
            self.window_s = window_s
            self.windows.append((float(ws.window_start) + window_s, dirs))
            self.with_data.append(bool(ws.idx.size))
            before, n_pending = dict(fusion.counters), len(fusion.pending)
            out = inner(ws, window_s, ae)
            moved = {k for k, v in fusion.counters.items() if v != before.get(k, 0)}
            self.holds.append(moved | ({"pending"} if len(fusion.pending) > n_pending else set()))
            return out

        det.fusion.process = process

    def data_windows(self, lo_s: float, hi_s: float) -> int:
        """Windows ending in (lo_s, hi_s] that held data (the samples the alarm waited for)."""
        return sum(d for (end, _), d in zip(self.windows, self.with_data) if lo_s < end <= hi_s + 1e-9)

    def paced(self) -> bool:
        """A step-paced run: fewer than 2 in 3 of its span's windows hold data (the collector
        emits no window without records)."""
        if len(self.windows) < 2:
            return False
        span = (self.windows[-1][0] - self.windows[0][0]) / self.window_s + 1
        return sum(self.with_data) < 2 / 3 * span

    def held_at(self, end_s: float) -> list[str]:
        """What the fusion stage did in the window ending at ``end_s`` (its moved counters)."""
        for (end, _), moved in zip(self.windows, self.holds):
            if abs(end - end_s) < 1e-6:
                return sorted(moved)
        return []

    def first_alarm_end(self, after_s: float, direction: int) -> float | None:
        """End of the first window ending after ``after_s`` with an alarm in ``direction``."""
        for end, dirs in self.windows:
            if end > after_s and direction in dirs:
                return end
        return None


def split_delay(onset: float, applied: float, detected: float, window_s: float,
                alarm_end: float | None, recovery: bool) -> dict[str, float]:
    """The four parts of ``detected - onset`` (see the module docstring); they sum to the delay."""
    applied = min(max(applied, onset), detected)
    close_end = min((math.floor(applied / window_s) + 1) * window_s, detected)
    if recovery or alarm_end is None or alarm_end > detected:
        alarm = detected
    else:
        alarm = max(alarm_end, close_end)
    return {"apply": applied - onset, "close": close_end - applied,
            "cusum": alarm - close_end, "fusion": detected - alarm}


def decompose_run(seed: int, run_dir: Path, config=None, window_s: float | None = None) -> list[dict]:
    """One row per labelled change of the run: its parts when reported, else ``reported`` False."""
    from dynamiccl.collector.config import WindowConfig
    from dynamiccl.detector.config import DetectorConfig
    from dynamiccl.detector.service import Detector
    from dynamiccl.harness.corpus import MATCH_S, _relabel
    from dynamiccl.harness.testbed.controller import TruthEvent
    from dynamiccl.harness.testbed.score import Detection, score
    from dynamiccl.report.replay import replay

    w = WindowConfig().window_s if window_s is None else window_s
    truth = json.loads((run_dir / "truth.json").read_text())
    events = sorted((TruthEvent(**_relabel(e)) for e in truth["events"]), key=lambda e: e.onset_wall)
    det = Detector(config or DetectorConfig())
    log = _AlarmLog(det)
    res = replay(str(run_dir / "records"), det.config, window_s=w, retuner=False, detector=det)
    by_id = {rc.id: rc for rc in res.changes}
    sc = score(events, [Detection.from_change(rc, rc.detected_s) for rc in res.changes], match_s=MATCH_S)
    rows = []
    for e, row in zip(events, sc.rows):
        out = {"seed": seed, "index": e.index, "do": e.do, "degrades": e.degrades, "reported": row["detected"]}
        rc = by_id.get(str(row.get("id"))) if row["detected"] else None
        if rc is not None:
            direction = 1 if e.degrades else -1
            rec = rc.kind == "recovery" or (rc.evidence or {}).get("step") == "softer"
            alarm = log.first_alarm_end(min(e.applied_wall, rc.detected_s) - 1e-9, direction)
            parts = split_delay(e.onset_wall, e.applied_wall, rc.detected_s, w, alarm, rec)
            close_end = e.applied_wall + parts["close"]
            out.update(kind=rc.kind, delay_s=rc.detected_s - e.onset_wall, **parts,
                       onset_error_s=rc.start_s - e.onset_wall, paced=log.paced(),
                       data_windows=log.data_windows(close_end - 1e-6,
                                                     close_end + parts["cusum"] + parts["fusion"]),
                       held=log.held_at(close_end + parts["cusum"]) if parts["fusion"] > 0 else [])
        rows.append(out)
    return rows


def _q(xs: list[float]) -> str:
    if not xs:
        return "-"
    a = np.asarray(xs)
    return f"{np.median(a):.2f} (q {np.quantile(a, 0.25):.2f}/{np.quantile(a, 0.75):.2f}, mean {a.mean():.2f})"


def summarise_parts(rows: list[dict], match_s: float = 5.0) -> dict:
    """Medians / quartiles / means of each part over the changes reported within ``match_s``."""
    hit = [r for r in rows if r["reported"] and r["delay_s"] <= match_s]
    out: dict[str, Any] = {"changes": len(rows), "reported": len(hit), "median_delay_s": float(np.median([r["delay_s"] for r in hit]))
           if hit else float("nan")}
    for sel, name in ((hit, "all"), ([r for r in hit if r["kind"] != "recovery"], "alarm"),
                      ([r for r in hit if r["kind"] == "recovery"], "recovery"),
                      ([r for r in hit if not r["paced"]], "dense"), ([r for r in hit if r["paced"]], "paced")):
        out[name] = {"n": len(sel), "delay": _q([r["delay_s"] for r in sel])}
        out[name].update({p: _q([r[p] for r in sel]) for p in PARTS})
        out[name]["data_windows"] = _q([r["data_windows"] for r in sel])
    return out


def main(argv: list[str] | None = None) -> int:
    from dynamiccl.harness import corpus

    ap = argparse.ArgumentParser(prog="python -m dynamiccl.harness.corpus_delay")
    ap.add_argument("--corpus", default=str(corpus.DEFAULT_CORPUS))
    ap.add_argument("--half", choices=("dev", "eval"), default="dev")
    ap.add_argument("--window", type=float, default=None, help="window length, s (default the collector's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="detector override")
    ap.add_argument("--out", default=None, help="write every change's parts here (JSON)")
    args = ap.parse_args(argv)
    from dynamiccl.detector.config import DetectorConfig, parse_overrides
    cfg = DetectorConfig().with_overrides(parse_overrides(args.set))
    rows: list[dict] = []
    for seed, d in corpus.load_runs(args.corpus, args.half):
        rows += decompose_run(seed, d, cfg, args.window)
    summary = summarise_parts(rows)
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    for name in ("all", "alarm", "recovery", "dense", "paced"):
        s = summary[name]
        print(f"{name:<9} n={s['n']:<4} delay {s['delay']}")
        for p in (*PARTS, "data_windows"):
            print(f"    {p:<7} {s[p]}")
    print(f"changes={summary['changes']} reported_within_5s={summary['reported']} "
          f"median_delay_s={summary['median_delay_s']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
