"""`dynamiccl detector evaluate`: the detector against simulator ground truth.

The suite is generated programmatically (seeded):

* **Event runs** per workload and seed: a 70 s quiet start (the baseline warm-up), then up to six
  regime events 60 s apart, each lasting 25-30 s and followed by its end (a true recovery), with
  benign changes (a message-size mix change, a checkpoint pause) in the gaps. Every kind
  (``bw_drop``, ``latency``, ``straggler``, ``flap``, ``incast``, ``degrading_nic``) is run at
  every target magnitude (1.05×, 1.1×, 1.25×, 1.5×, 2×, 4×). The magnitude is the slowdown of
  the job's *dominant affected collective* (the one with most collective time among those the
  event touches), set by solving the simulator's performance model for the event parameter.
* **Stationary runs**: hours of simulated training with realistic noise and benign changes,
  plus one run with bad input (a node's clock jumping, a rank vanishing, garbage durations).

Realistic noise (all runs): per-instance lognormal noise (σ = 5 %), heavy-tailed slow instances
(1 %, Pareto), job-wide hiccups (1 per 2 minutes, 200 ms, ×1.5), and an AR(1) background load on
multi-node collectives (σ = 0.5 %, ρ = 0.5 per second). Records go straight into the collector's
own window aggregation (`dynamiccl.harness.simfeed`), so the features are the collector's real ones.

Scoring (all times are event time):

* a true event is **detected** if a non-recovery change is detected within 5 s of its onset
  (``detected_s − t_start ∈ [−1, 5]``); **recall** = detected / events;
* **precision** = changes that match a true event / all changes, where a non-recovery change
  matches an event active at its detection (at most one non-flapping and one flapping change per
  event) and a recovery matches an event's end (``[t_end − 1, t_end + 5]``, or any time during a
  flapping/bursty event, or up to ``flap_window_s`` after a flap's end); changes in stationary runs
  never match;
* **delay ratio**: ``(detected_s − onset) / (align + max(1, D*) · window)`` with D* the CUSUM
  optimum (`dynamiccl.detector.arl.cusum_delay_bound` at the detector's per-stream ARL0, both sides) for the
  realised shift of the change's strongest stream in baseline σ, and ``align`` the time from the
  onset to the start of the first whole post-change window;
* **false alarms per day** = regime changes (not counting their recoveries, which count in
  precision) in stationary runs / simulated hours × 24;
* **straggler top-1**: straggler events whose first change names the true rank first (the rank
  in the first communicator listed), over all straggler events (a miss counts as wrong);
* **updates/s**: `CUSUMBank.update_many` stream updates per second, 10,000 streams, one core.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

# the suite is part of this module's API (re-exported)
from dynamiccl.harness.detector_suite import (  # noqa: F401
    BURSTY,
    DETECT_WITHIN_S,
    EVAL_MIXED,
    EVENT_KINDS,
    EXPECTED_KIND,
    GAP_S,
    MAGNITUDES,
    WARM_S,
    WORKLOADS,
    RunSpec,
    _Calibrator,
    build_suite,
    load_workload,
    realism,
)
from dynamiccl.loop import Loop
from dynamiccl.contracts.atomic import atomic_write

log = logging.getLogger("dynamiccl.harness.detector_eval")


def run_one(spec: RunSpec, config=None, window_s: float | None = None) -> dict:
    from dynamiccl.detector.config import DetectorConfig
    from dynamiccl.detector.service import Detector
    from dynamiccl.harness.simfeed import SimFeed
    from dynamiccl.harness.simulator import scenario as S

    cfg = config or DetectorConfig()
    wl = load_workload(spec.workload)
    sc = S.from_dict({"name": spec.name, "noise_sigma": 0.05, "duration_s": spec.duration_s,
                      "events": spec.events})
    feed = SimFeed(wl, sc, seed=spec.seed, duration_s=spec.duration_s, realism=realism(**spec.realism),
                   job_id=spec.name, window_s=window_s)
    det = Detector(cfg)
    loop = Loop(det)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    det_cpu = 0.0
    changes = []
    n_windows = 0
    for wf in feed.windows():
        c0 = time.process_time()
        changes.extend(loop.step(wf).changes)
        det_cpu += time.process_time() - c0
        n_windows += 1
    epoch = feed.epoch_s
    truth = sc.truth(duration_s=spec.duration_s)
    comms = {c.comm_hash: list(c.ranks) for c in wl.comms}
    return {
        "spec": asdict(spec), "epoch": epoch, "truth": truth,
        "changes": [json.loads(c.to_json()) for c in changes],
        "windows": n_windows, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0,
        "detector_cpu_s": det_cpu, "comm_ranks": {f"0x{h:x}": r for h, r in comms.items()},
        "counters": dict(det.fusion.counters), "streams": det.table.n_active,
        "dropped": {r: det.metrics.value("dynamiccl_detector_windows_dropped_total", reason=r)
                    for r in ("malformed", "out_of_order", "error")},
    }


# ------------------------------------------------------------------------------------------------
# scoring
# ------------------------------------------------------------------------------------------------
def score(results: list[dict], config=None) -> dict:
    from dynamiccl.detector.arl import cusum_delay_bound
    from dynamiccl.detector.config import DetectorConfig

    cfg = config or DetectorConfig()
    events = []          # per true (non-benign) event
    tp = fp = 0
    fp_changes = []
    rec_total = rec_hit = 0
    stationary_hours = 0.0
    stationary_fa = 0
    stationary_changes = 0
    for res in results:
        spec, epoch = res["spec"], res["epoch"]
        changes = sorted(res["changes"], key=lambda c: c["detected_s"])
        for c in changes:
            c["t_start"] = c["start_s"] - epoch
            c["t_det"] = c["detected_s"] - epoch
        if spec["stationary"]:
            stationary_hours += spec["duration_s"] / 3600.0
            # a false alarm is a false regime change; its recovery is counted in precision only
            stationary_fa += sum(c["kind"] != "recovery" for c in changes)
            stationary_changes += len(changes)
            fp += len(changes)
            fp_changes += [{**c, "run": spec["name"]} for c in changes]
            continue
        truth = [e for e in res["truth"] if not e["benign"] and e["kind"] != "recovery"]
        meta = spec["meta"]
        used: dict[int, set] = {}
        matched_ids = {}
        for j, (e, m) in enumerate(zip(truth, meta)):
            first = next((c for c in changes if c["kind"] != "recovery"
                          and -1.0 <= c["t_det"] - e["t_start"] <= DETECT_WITHIN_S), None)
            ev = {"run": spec["name"], "workload": spec["workload"], "kind": e["kind"], "target": m["target"],
                  "t_start": e["t_start"], "t_end": e["t_end"], "detected": first is not None,
                  "delay_s": (first["t_det"] - e["t_start"]) if first else None,
                  "change_kind": first["kind"] if first else None, "rank": m.get("rank")}
            if first is not None:
                z = [s.get("z") for s in first["evidence"].get("streams", []) if s.get("z") is not None]
                delta = max(abs(v) for v in z) if z else float("nan")
                ev["delta_sigma"] = delta
                align = math.ceil(e["t_start"]) - e["t_start"]
                arl0 = float(first["evidence"].get("arl0", cfg.cusum.arl0))
                dstar = cusum_delay_bound(2 * arl0, delta) if delta == delta and delta > 0 else float("nan")
                opt = align + max(1.0, dstar if dstar == dstar else 1.0)
                ev["optimum_s"] = opt
                ev["delay_ratio"] = ev["delay_s"] / opt
                if e["kind"] == "straggler":
                    ranks = res["comm_ranks"].get(first["comms"][0]) if first["comms"] else None
                    ev["top1"] = bool(first["ranks"] and ranks and first["ranks"][0] < len(ranks)
                                      and ranks[first["ranks"][0]] == m["rank"])
            elif e["kind"] == "straggler":
                ev["top1"] = False
            # any change of the kinds this event should produce, during it
            kinds_seen = {c["kind"] for c in changes if c["kind"] != "recovery"
                          and e["t_start"] - 1 <= c["t_det"] <= e["t_end"] + DETECT_WITHIN_S}
            ev["kind_ok"] = bool(kinds_seen & EXPECTED_KIND[e["kind"]])
            if m.get("selected", True):     # a subset run (--kinds/--magnitudes) scores only its selection
                events.append(ev)
            # recovery recall: a recovery within 5 s of the end
            late = cfg.incidents.flap_window_s if e["kind"] in BURSTY else DETECT_WITHIN_S
            ev["recovered_within_5s"] = any(c["kind"] == "recovery" and -1.0 <= c["t_det"] - e["t_end"] <= DETECT_WITHIN_S
                                            for c in changes)
            if m.get("selected", True):
                rec_total += 1
                rec_hit += ev["recovered_within_5s"]
            used[j] = set()
            for c in changes:
                if c["kind"] == "recovery":
                    ok = (-1.0 <= c["t_det"] - e["t_end"] <= late) or (
                        e["kind"] in BURSTY and e["t_start"] <= c["t_det"] <= e["t_end"])
                else:
                    ok = e["t_start"] - 1.0 <= c["t_det"] <= e["t_end"] + DETECT_WITHIN_S
                slot = "recovery" if c["kind"] == "recovery" else ("flapping" if c["kind"] == "flapping" else "main")
                if ok and c["id"] not in matched_ids and (slot == "recovery" or slot not in used[j]):
                    if slot != "recovery":
                        used[j].add(slot)
                    matched_ids[c["id"]] = j
        for c in changes:
            if c["id"] in matched_ids and not meta[matched_ids[c["id"]]].get("selected", True):
                continue                # matches an event outside the selected subset
            if c["id"] in matched_ids:
                tp += 1
            else:
                fp += 1
                fp_changes.append({**c, "run": spec["name"]})
    n_changes = tp + fp
    out = {"events": events, "false_positive_changes": fp_changes[:50]}
    out["precision"] = tp / n_changes if n_changes else 1.0
    out["recall"] = sum(e["detected"] for e in events) / len(events) if events else float("nan")
    ratios = [e["delay_ratio"] for e in events if e.get("delay_ratio") is not None]
    out["delay_ratio_median"] = statistics.median(ratios) if ratios else float("nan")
    out["false_alarms_per_day"] = stationary_fa / stationary_hours * 24.0 if stationary_hours else float("nan")
    out["stationary_hours"] = stationary_hours
    out["stationary_false_alarms"] = stationary_fa
    out["stationary_changes"] = stationary_changes
    strag = [e for e in events if e["kind"] == "straggler"]
    out["straggler_top1"] = sum(e.get("top1", False) for e in strag) / len(strag) if strag else float("nan")
    out["recovery_recall"] = rec_hit / rec_total if rec_total else float("nan")
    out["kind_accuracy"] = sum(e["kind_ok"] for e in events if e["detected"]) / max(1, sum(e["detected"] for e in events))
    # per magnitude / per kind tables
    per_mag = {}
    for m in sorted({e["target"] for e in events}):
        sel = [e for e in events if e["target"] == m]
        rr = [e["delay_ratio"] for e in sel if e.get("delay_ratio") is not None]
        dd = [e["delay_s"] for e in sel if e["detected"]]
        per_mag[m] = {"events": len(sel), "recall": sum(e["detected"] for e in sel) / len(sel),
                      "delay_s_median": statistics.median(dd) if dd else None,
                      "delay_ratio_median": statistics.median(rr) if rr else None,
                      "delta_sigma_median": statistics.median([e["delta_sigma"] for e in sel if "delta_sigma" in e])
                      if any("delta_sigma" in e for e in sel) else None,
                      "kind_ok": sum(e["kind_ok"] for e in sel if e["detected"]) / max(1, sum(e["detected"] for e in sel))}
    out["per_magnitude"] = per_mag
    per_kind = {}
    for k in EVENT_KINDS:
        sel = [e for e in events if e["kind"] == k]
        if sel:
            per_kind[k] = {"events": len(sel), "recall": sum(e["detected"] for e in sel) / len(sel),
                           "kind_ok": sum(e["kind_ok"] for e in sel if e["detected"]) / max(1, sum(e["detected"] for e in sel)),
                           "recovered_within_5s": sum(e["recovered_within_5s"] for e in sel) / len(sel)}
    out["per_kind"] = per_kind
    per_wl = {}
    for w in sorted({e["workload"] for e in events}):
        sel = [e for e in events if e["workload"] == w]
        per_wl[w] = {"events": len(sel), "recall": sum(e["detected"] for e in sel) / len(sel)}
    out["per_workload"] = per_wl
    out["windows_dropped_error"] = sum(r.get("dropped", {}).get("error", 0) for r in results)
    return out


def cusum_updates_per_s(n_streams: int = 10_000, seconds: float = 0.5, seed: int = 0) -> float:
    from dynamiccl.detector.cusum_bank import CUSUMBank
    rng = np.random.default_rng(seed)
    bank = CUSUMBank(n_streams=n_streams, warmup=60)
    x = rng.standard_normal((64, n_streams))
    for i in range(61):
        bank.update_many(x[i % 64])
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        bank.update_many(x[n % 64])
        n += 1
    return n * n_streams / (time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    from dynamiccl.progress import add_progress_flag
    add_progress_flag(p)
    p.add_argument("--quick", action="store_true", help="a small suite for tests (< 60 s)")
    p.add_argument("--suite", choices=("simulated", "testbed"), default="simulated",
                   help="simulated (default) or testbed: the recorded test-bed corpus (docs/corpus.md)")
    p.add_argument("--corpus", default=None, help="testbed suite: corpus folder or .tar.xz (default the shipped one)")
    p.add_argument("--half", choices=("eval", "dev"), default="eval", help="testbed suite: which half (default eval)")
    p.add_argument("--seeds", type=int, default=2, help="seeds per workload (default 2)")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes (default 1)")
    p.add_argument("--stationary-hours", type=float, default=None,
                   help="simulated hours of stationary llama70b-fsdp training, plus 1/12 of it for each "
                        "2-node workload (default 24; quick 0.15; 0: event runs only)")
    p.add_argument("--workloads", default=None, metavar="W[,W...]",
                   help=f"subset for iteration: only these workloads ({', '.join(WORKLOADS)})")
    p.add_argument("--kinds", default=None, metavar="K[,K...]",
                   help=f"subset: only event runs holding these kinds, scored on them ({', '.join(EVENT_KINDS)})")
    p.add_argument("--magnitudes", default=None, metavar="M[,M...]",
                   help="subset: only event runs holding these magnitudes (e.g. 1.05,1.1), scored on them")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a detector setting by dotted key for this evaluation (repeatable), "
                        "e.g. fusion.persist_ratio=1.5")
    p.add_argument("--window", type=float, default=None, metavar="S",
                   help="window length, s of event time, for both suites (default the collector's window.window_s)")
    p.add_argument("--out", default=None, help="write the full report (JSON) here, and every run's changes "
                                                  "next to it (NAME.runs.json)")


def _fmt(v, nd=3):
    return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def _overridden(args: argparse.Namespace):
    """The detector config with ``--set`` applied, or None when there is no ``--set``."""
    from dynamiccl.detector.config import DetectorConfig, parse_overrides
    overrides = parse_overrides(getattr(args, "set", None) or [])
    if not overrides:
        return None
    print(f"config overrides: {overrides}", flush=True)
    return DetectorConfig().with_overrides(overrides)


def _window(args: argparse.Namespace) -> float | None:
    """``--window``, checked; None: the collector's default window."""
    w = getattr(args, "window", None)
    if w is not None and not (math.isfinite(w) and w > 0):
        raise ValueError(f"--window must be > 0 s, got {w!r}")
    return w


def run(args: argparse.Namespace) -> int:
    from dynamiccl.detector.config import DetectorConfig
    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    if getattr(args, "suite", "simulated") == "testbed":
        return _run_testbed(args)
    cfg = _overridden(args) or DetectorConfig()
    hours = None
    if args.stationary_hours is not None:
        h = args.stationary_hours
        hours = {"llama70b-fsdp": h} if args.quick else {"llama70b-fsdp": h, "llama7b-tp8-dp2": h / 12,
                                                          "eval-mixed": h / 12}
    t0 = time.perf_counter()
    def _list(v, conv=str):
        return tuple(conv(x) for x in v.split(",") if x.strip()) if v else None
    subset = {"workloads": _list(getattr(args, "workloads", None)), "kinds": _list(getattr(args, "kinds", None)),
              "magnitudes": _list(getattr(args, "magnitudes", None), float)}
    if any(subset.values()):
        print(f"subset: { {k: v for k, v in subset.items() if v} } (not the full suite)", flush=True)
    suite = build_suite(1 if args.quick else args.seeds, quick=args.quick, stationary_hours=hours, **subset)
    print(f"suite: {sum(not r.stationary for r in suite)} event runs "
          f"({sum(len(r.meta) for r in suite)} events), {sum(r.stationary for r in suite)} stationary runs "
          f"({sum(r.duration_s for r in suite if r.stationary) / 3600:.1f} simulated hours)", flush=True)
    from dynamiccl.progress import enabled_for, progress
    results = []
    with progress(len(suite), "detector evaluate", enabled=enabled_for(args)) as step:
        if args.jobs > 1:
            import functools
            from concurrent.futures import ProcessPoolExecutor
            with ProcessPoolExecutor(args.jobs) as ex:
                for res in ex.map(functools.partial(run_one, config=cfg, window_s=_window(args)), suite):
                    results.append(res)
                    _progress(res)
                    step()
        else:
            for spec in suite:
                res = run_one(spec, cfg, _window(args))
                results.append(res)
                _progress(res)
                step()
    rep = score(results, cfg)
    ups = cusum_updates_per_s()
    rep["updates_per_s"] = ups
    windows = sum(r["windows"] for r in results)
    det_cpu = sum(r["detector_cpu_s"] for r in results)
    rep["detector_cpu_per_window_ms"] = det_cpu / max(windows, 1) * 1e3
    rep["wall_s"] = time.perf_counter() - t0
    _print_report(rep)
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(rep, indent=1, default=str), fsync=False)
        raw = path.with_name(path.stem + ".runs.json")     # every run's changes, for re-scoring
        atomic_write(raw, json.dumps(results, default=str), fsync=False)
    print(f"precision={rep['precision']:.3f} recall={rep['recall']:.3f} "
          f"delay_ratio_median={_fmt(rep['delay_ratio_median'], 2)} "
          f"false_alarms_per_day={_fmt(rep['false_alarms_per_day'], 2)} "
          f"straggler_top1={_fmt(rep['straggler_top1'])} updates_per_s={ups:.0f}", flush=True)
    return 0


def _run_testbed(args: argparse.Namespace) -> int:
    from dynamiccl.harness import corpus
    rep = corpus.run_suite(args.corpus or corpus.DEFAULT_CORPUS, args.half, config=_overridden(args),
                           window_s=_window(args))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rep, indent=1, default=str))
    print(corpus.line(rep), flush=True)
    return 0


def _progress(res: dict) -> None:
    s = res["spec"]
    print(f"  {s['name']}: {res['windows']} windows, {len(res['changes'])} changes, "
          f"{res['wall_s']:.1f} s", file=sys.stderr, flush=True)


def _print_report(rep: dict) -> None:
    print("\nper magnitude (target slowdown of the dominant affected collective):")
    print(f"  {'magnitude':>9} {'events':>6} {'recall':>7} {'delay_s':>8} {'ratio':>6} {'shift_sigma':>11} {'kind_ok':>7}")
    for m, r in rep["per_magnitude"].items():
        print(f"  {m:>8.2f}x {r['events']:>6} {r['recall']:>7.3f} {_fmt(r['delay_s_median'], 2):>8} "
              f"{_fmt(r['delay_ratio_median'], 2):>6} {_fmt(r['delta_sigma_median'], 1):>11} {r['kind_ok']:>7.3f}")
    print("per kind:")
    for k, r in rep["per_kind"].items():
        print(f"  {k:>13} events={r['events']:<4} recall={r['recall']:.3f} kind_ok={r['kind_ok']:.3f} "
              f"recovery_within_5s={r['recovered_within_5s']:.3f}")
    print("per workload:", ", ".join(f"{w}: recall {r['recall']:.3f} ({r['events']})" for w, r in rep["per_workload"].items()))
    print(f"recovery recall (within 5 s of the end): {rep['recovery_recall']:.3f}; "
          f"kind accuracy of detected events: {rep['kind_accuracy']:.3f}")
    if rep.get("windows_dropped_error"):
        print(f"WARNING: {rep['windows_dropped_error']:.0f} windows dropped by internal errors (a bug)")
    print(f"stationary: {rep['stationary_false_alarms']} false regime changes ({rep['stationary_changes']} changes "
          f"with their recoveries) in {rep['stationary_hours']:.2f} simulated hours; "
          f"detector CPU {rep['detector_cpu_per_window_ms']:.2f} ms/window; wall {rep['wall_s']:.0f} s")
    for c in rep["false_positive_changes"][:10]:
        print(f"  unmatched: {c['run']} {c['kind']} at {c['t_det']:.1f} s mag={c['magnitude']} comms={c['comm_names'][:3]}")
