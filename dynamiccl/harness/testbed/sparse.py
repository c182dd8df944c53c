"""The sparse job on the test bed (issue 17): one data-parallel all-reduce per ~5 s step, slowed 1.5x.

Target: "a 1.5x slowdown reported within 10 steps; no false alarm in one stationary hour", at the
detector's defaults, live and in ``dynamiccl replay``'s code path.

* :func:`scenario` — the throttled run of a seed, a pure function of it (``random.Random(seed)``):
  2-4 gloo ranks, one 2 MiB all-reduce per step (0.3-0.5 s on the 50 Mbit/s links: transfer, not
  latency, so a capacity cut slows it in proportion), ``STEP_S`` - 0.45 s of "compute", and at the
  onset one throttle to ``THROTTLE_MBIT`` (sized from two pilot runs to give ~1.5x) of one rank's link or of every
  link. Seeds whose ``seed % 4`` is 0 or 1 put the onset inside the job's first minute (35-55 s
  after streaming starts: 7-11 steps of baseline, the early chart's case); 2 or 3 after several
  minutes (180-300 s). The live detector runs ``DetectorConfig()`` (scenario field
  ``detector: defaults``) on 1 s windows, the replay CLI's window.
* Split fixed before recording: even seeds develop, odd seeds evaluate (:func:`split`).
* :func:`score_run` — for one recorded run: the measured slowdown (median all-reduce duration,
  per-instance median over ranks, the 10 instances after the onset over the 10 before), and for
  the live detector (``detections.ndjson``, emission wall time), the saved windows re-run through
  a fresh live detector at defaults (``live_rerun``: the live result at the present code, the
  windows as they arrived and when, every one from the first as the harness now gives them) and the replay of ``records/``
  through :func:`dynamiccl.report.replay.replay` at defaults (the change's ``detected_s``): the
  first degradation reported after the onset, in seconds and in steps (instances that *started*
  after the onset and had finished by the report), and every report before it (false alarms).
* The stationary hour: ``scenarios/sparse-stationary.yaml`` (no change; every report is a false
  alarm), scored by the same :func:`score_run`.

Record and score (root, iproute2)::

    python -m dynamiccl.harness.testbed.sparse record --seeds 0-7 --out runs/sparse
    python -m dynamiccl.harness.testbed.sparse score runs/sparse/seed-00*
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from dynamiccl.harness.testbed.generate import split  # the corpus rule: even seeds dev, odd eval, fixed before recording
from dynamiccl.harness.testbed.scenario import Action, Scenario

__all__ = ["scenario", "split", "score_run", "STEP_S", "THROTTLE_MBIT", "TARGET_STEPS", "main"]

STEP_S = 5.0
BUCKET = "2m"
BASE_MBIT = 50.0
THROTTLE_MBIT = 30.0   # 50 -> 30: pilot runs at 34 Mbit/s measured 1.36x (one rank of 3) and 1.39x (all of 2);
                       # duration = a + b / capacity through those points puts 1.5x at 30-31 Mbit/s
TARGET_STEPS = 10      # issue 17: reported within 10 steps
TAIL_S = 75.0          # after the onset: 15 steps, room for the target and a margin
RATIO_N = 10           # instances either side of the onset for the measured slowdown


def scenario(seed: int) -> Scenario:
    """The throttled sparse run of ``seed`` (deterministic)."""
    rng = random.Random(seed)
    nranks = rng.randint(2, 4)
    early = seed % 4 in (0, 1)
    onset = rng.uniform(35, 55) if early else rng.uniform(180, 300)
    warmup = 10.0  # streaming start -> t0; the detector sees every window from the start
    ranks = None if rng.random() < 0.4 else (rng.randrange(nranks),)
    act = Action(round(onset - warmup, 1), "throttle", ranks, THROTTLE_MBIT)
    return Scenario(f"sparse{seed:03d}", nranks=nranks, base_mbit=BASE_MBIT, buckets=BUCKET, batch_bytes=0,
                    compute_ms=STEP_S * 1000 - 450, window_s=1.0, detector="defaults", warmup_s=warmup,
                    tail_s=TAIL_S, actions=(act,)).validate()


# -- scoring --------------------------------------------------------------------------------------
def _instances(run_dir: Path):
    """Per instance (seq_number of the one communicator): start (earliest enqueue, s), end (latest
    end, s) and the median duration over ranks (s)."""
    import polars as pl

    from dynamiccl.detector.localise import read_instances
    r = read_instances(run_dir / "records")
    r = r.with_columns(((pl.col("end_ns") - pl.col("enqueue_ns")) / 1e9).alias("dur"))
    return (r.group_by("comm_hash", "seq_number")
             .agg((pl.col("enqueue_ns").min() / 1e9).alias("start"), (pl.col("end_ns").max() / 1e9).alias("end"),
                  pl.col("dur").median().alias("dur"), pl.len().alias("n"))
             .sort("start"))


def slowdown(inst, onset: float, n: int = RATIO_N) -> float:
    """Median duration of the ``n`` instances starting after ``onset`` over the ``n`` before it."""
    import statistics
    before = [d for s, d in zip(inst["start"], inst["dur"]) if s < onset][-n:]
    after = [d for s, d in zip(inst["start"], inst["dur"]) if s >= onset][:n]
    if not before or not after:
        return float("nan")
    return statistics.median(after) / statistics.median(before)


def _first_report(reports: list[tuple[float, dict]], onset: float | None, inst) -> dict:
    """Reports are (time, change); the first degradation at or after ``onset`` and the reports before."""
    before = [c for t, c in reports if onset is None or t < onset]
    out: dict = {"false_alarms": len(before), "false": [f"{c['kind']} x{c['magnitude']:.2f}" for c in before]}
    if onset is None:
        return out
    after = [(t, c) for t, c in reports if t >= onset and c["kind"] != "recovery"]
    if not after:
        out.update(reported=False, delay_s=None, steps=None)
        return out
    t, c = after[0]
    steps = sum(1 for s, e in zip(inst["start"], inst["end"]) if s >= onset and e <= t)
    out.update(reported=True, delay_s=round(t - onset, 2), steps=steps, kind=c["kind"],
               magnitude=round(c["magnitude"], 2), later_reports=len(after) - 1)
    return out


def _live_reports(run_dir: Path) -> list[tuple[float, dict]]:
    path = run_dir / "detections.ndjson"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return [(r["wall_s"], r) for r in rows]


def _replay_reports(run_dir: Path) -> list[tuple[float, dict]]:
    from dynamiccl.detector.config import DetectorConfig
    from dynamiccl.report.replay import replay
    res = replay(str(run_dir / "records"), DetectorConfig(), retuner=False)
    return [(rc.detected_s, {"kind": rc.kind, "magnitude": rc.magnitude}) for rc in res.changes]


def _rerun_reports(run_dir: Path) -> list[tuple[float, dict]]:
    """The run's saved windows (``windows_*.parquet``, with the wall time each reached the live
    detector) through a fresh live detector at defaults: the live result at the code of now."""
    from dynamiccl.harness.testbed.analyse import _detect_span, load_windows
    from dynamiccl.harness.testbed.detect import LiveDetector
    from dynamiccl.loop import Loop
    _, hi = _detect_span(run_dir)   # every window from the first, as a `detector: defaults` run now gives them
    windows = [(wf, r) for wf, r in load_windows(run_dir) if wf.window_start + wf.window_s <= hi]
    clock = {"now": 0.0}
    det = LiveDetector(windows[0][0].window_s if windows else 1.0, clock=lambda: clock["now"], defaults=True)
    loop, out = Loop(det), []
    for wf, received in windows:
        clock["now"] = received
        out += [(d.wall_s, {"kind": d.kind, "magnitude": d.magnitude}) for d in loop.step(wf).changes]
    return out


def score_run(run_dir: Path | str) -> dict:
    """Live and replay scores of one run (throttled or stationary), and its measured slowdown."""
    run_dir = Path(run_dir)
    truth = json.loads((run_dir / "truth.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    events = truth.get("events", [])
    onset = events[0]["onset_wall"] if events else None
    inst = _instances(run_dir)
    starts = list(inst["start"])
    step = (starts[-1] - starts[0]) / (len(starts) - 1) if len(starts) > 1 else float("nan")
    # the live detector saw windows up to detect_until only (the job's shutdown is not scored)
    until = summary.get("detect_until", float("inf"))
    replay = [(t, c) for t, c in _replay_reports(run_dir) if t <= until]
    out = {"run": run_dir.name, "scenario": truth.get("scenario"), "nranks": truth.get("nranks"),
           "instances": len(starts), "step_s": round(step, 3), "monitored_s": round(starts[-1] - starts[0], 1)
           if starts else 0.0, "onset_after_start_s": round(onset - starts[0], 1) if onset and starts else None,
           "where": events[0]["description"] if events else "stationary",
           "slowdown": round(slowdown(inst, onset), 3) if onset else None,
           "live": _first_report(_live_reports(run_dir), onset, inst),
           "live_rerun": _first_report(_rerun_reports(run_dir), onset, inst),
           "replay": _first_report(replay, onset, inst)}
    return out


def line(s: dict) -> str:
    def part(name):
        v = s[name]
        if s["slowdown"] is None:
            return f"{name}_false_alarms={v['false_alarms']}"
        got = f"{v['steps']}steps/{v['delay_s']}s" if v.get("reported") else "missed"
        return f"{name}={got} {name}_false_alarms={v['false_alarms']}"
    return (f"{s['run']} ranks={s['nranks']} onset_after_start_s={s['onset_after_start_s']} "
            f"slowdown={s['slowdown']} step_s={s['step_s']} {part('live')} {part('live_rerun')} {part('replay')}")


# -- CLI ------------------------------------------------------------------------------------------
def record(seeds: list[int], out: Path, *, nice: int = 0) -> int:
    from dynamiccl.harness.testbed.generate import record_seeds

    def describe(sc: Scenario) -> str:
        return (f"{sc.nranks} ranks, {sc.actions[0].describe(sc.base_mbit)} at "
                f"{sc.warmup_s + sc.actions[0].at_s:.0f} s, {sc.duration_s:.0f} s")
    return record_seeds(seeds, out, scenario, nice=nice, prefix="dtb", describe=describe,
                        report=lambda d, res: line(score_run(d)))


def main(argv: list[str] | None = None) -> int:
    from dynamiccl.harness.testbed.generate import parse_seeds
    ap = argparse.ArgumentParser(prog="python -m dynamiccl.harness.testbed.sparse")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show", help="print the scenarios of some seeds")
    s.add_argument("--seeds", default="0-7")
    r = sub.add_parser("record", help="record the throttled runs of some seeds (root)")
    r.add_argument("--seeds", default="0-7")
    r.add_argument("--out", default="runs/sparse")
    r.add_argument("--nice", type=int, default=0, help="priority increment of the test bed's processes")
    c = sub.add_parser("score", help="score recorded runs (live and replay), one line each")
    c.add_argument("runs", nargs="+")
    c.add_argument("--json", default=None, help="also write every score here")
    args = ap.parse_args(argv)
    if args.cmd == "show":
        for seed in parse_seeds(args.seeds):
            sc = scenario(seed)
            a = sc.actions[0]
            print(f"seed {seed} ({split(seed)}) {sc.nranks} ranks: {a.describe(sc.base_mbit)} at "
                  f"{sc.warmup_s + a.at_s:.1f} s after streaming starts")
        return 0
    if args.cmd == "record":
        return 1 if record(parse_seeds(args.seeds), Path(args.out), nice=args.nice) else 0
    scores = [score_run(p) for p in args.runs]
    for sc in scores:
        print(line(sc))
    if args.json:
        Path(args.json).write_text(json.dumps(scores, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
