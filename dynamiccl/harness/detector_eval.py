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

import json
import logging
import math
import statistics
import time
from dataclasses import asdict

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
