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
from dataclasses import asdict, dataclass, field

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
@dataclass
class _Tally:
    """Counts over every run of a suite."""
    events: list = field(default_factory=list)     # per true (non-benign) event
    tp: int = 0
    fp: int = 0
    fp_changes: list = field(default_factory=list)
    rec_total: int = 0
    rec_hit: int = 0
    stationary_hours: float = 0.0
    stationary_fa: int = 0
    stationary_changes: int = 0


def _detected_event(ev: dict, e: dict, m: dict, first: dict, res: dict, cfg) -> None:
    """A detected event's delay against the CUSUM optimum for its measured shift, and (a
    straggler) whether the right rank was named first."""
    from dynamiccl.detector.arl import cusum_delay_bound

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


def _event(spec: dict, res: dict, e: dict, m: dict, changes: list, cfg) -> dict:
    """One true event scored: its first non-recovery change within [-1, DETECT_WITHIN_S] s of its
    start, the change kinds seen during it, and a recovery within 5 s of its end."""
    first = next((c for c in changes if c["kind"] != "recovery"
                  and -1.0 <= c["t_det"] - e["t_start"] <= DETECT_WITHIN_S), None)
    ev = {"run": spec["name"], "workload": spec["workload"], "kind": e["kind"], "target": m["target"],
          "t_start": e["t_start"], "t_end": e["t_end"], "detected": first is not None,
          "delay_s": (first["t_det"] - e["t_start"]) if first else None,
          "change_kind": first["kind"] if first else None, "rank": m.get("rank")}
    if first is not None:
        _detected_event(ev, e, m, first, res, cfg)
    elif e["kind"] == "straggler":
        ev["top1"] = False
    kinds_seen = {c["kind"] for c in changes if c["kind"] != "recovery"
                  and e["t_start"] - 1 <= c["t_det"] <= e["t_end"] + DETECT_WITHIN_S}
    ev["kind_ok"] = bool(kinds_seen & EXPECTED_KIND[e["kind"]])
    ev["recovered_within_5s"] = any(c["kind"] == "recovery" and -1.0 <= c["t_det"] - e["t_end"] <= DETECT_WITHIN_S
                                    for c in changes)
    return ev


def _claim(j: int, e: dict, changes: list, matched_ids: dict, cfg) -> None:
    """The changes event ``j`` accounts for: one main change and one flapping change during it,
    and any recoveries near its end (during it, for bursty kinds); a change is claimed once."""
    late = cfg.incidents.flap_window_s if e["kind"] in BURSTY else DETECT_WITHIN_S
    used: set = set()
    for c in changes:
        if c["kind"] == "recovery":
            ok = (-1.0 <= c["t_det"] - e["t_end"] <= late) or (
                e["kind"] in BURSTY and e["t_start"] <= c["t_det"] <= e["t_end"])
        else:
            ok = e["t_start"] - 1.0 <= c["t_det"] <= e["t_end"] + DETECT_WITHIN_S
        slot = "recovery" if c["kind"] == "recovery" else ("flapping" if c["kind"] == "flapping" else "main")
        if ok and c["id"] not in matched_ids and (slot == "recovery" or slot not in used):
            if slot != "recovery":
                used.add(slot)
            matched_ids[c["id"]] = j


def _score_run(res: dict, tally: _Tally, cfg) -> None:
    spec, epoch = res["spec"], res["epoch"]
    changes = sorted(res["changes"], key=lambda c: c["detected_s"])
    for c in changes:
        c["t_start"] = c["start_s"] - epoch
        c["t_det"] = c["detected_s"] - epoch
    if spec["stationary"]:
        tally.stationary_hours += spec["duration_s"] / 3600.0
        # a false alarm is a false regime change; its recovery is counted in precision only
        tally.stationary_fa += sum(c["kind"] != "recovery" for c in changes)
        tally.stationary_changes += len(changes)
        tally.fp += len(changes)
        tally.fp_changes += [{**c, "run": spec["name"]} for c in changes]
        return
    truth = [e for e in res["truth"] if not e["benign"] and e["kind"] != "recovery"]
    meta = spec["meta"]
    matched_ids: dict = {}
    for j, (e, m) in enumerate(zip(truth, meta)):
        ev = _event(spec, res, e, m, changes, cfg)
        if m.get("selected", True):     # a subset run (--kinds/--magnitudes) scores only its selection
            tally.events.append(ev)
            tally.rec_total += 1
            tally.rec_hit += ev["recovered_within_5s"]
        _claim(j, e, changes, matched_ids, cfg)
    for c in changes:
        if c["id"] in matched_ids and not meta[matched_ids[c["id"]]].get("selected", True):
            continue                # matches an event outside the selected subset
        if c["id"] in matched_ids:
            tally.tp += 1
        else:
            tally.fp += 1
            tally.fp_changes.append({**c, "run": spec["name"]})


def _share(sel: list, key: str) -> float:
    return sum(e[key] for e in sel) / len(sel)


def _kind_ok(sel: list) -> float:
    return sum(e["kind_ok"] for e in sel if e["detected"]) / max(1, sum(e["detected"] for e in sel))


def _tables(events: list) -> dict:
    """Per magnitude, kind and workload: events, recall and their other shares."""
    per_mag = {}
    for m in sorted({e["target"] for e in events}):
        sel = [e for e in events if e["target"] == m]
        rr = [e["delay_ratio"] for e in sel if e.get("delay_ratio") is not None]
        dd = [e["delay_s"] for e in sel if e["detected"]]
        ds = [e["delta_sigma"] for e in sel if "delta_sigma" in e]
        per_mag[m] = {"events": len(sel), "recall": _share(sel, "detected"),
                      "delay_s_median": statistics.median(dd) if dd else None,
                      "delay_ratio_median": statistics.median(rr) if rr else None,
                      "delta_sigma_median": statistics.median(ds) if ds else None,
                      "kind_ok": _kind_ok(sel)}
    per_kind = {}
    for k in EVENT_KINDS:
        sel = [e for e in events if e["kind"] == k]
        if sel:
            per_kind[k] = {"events": len(sel), "recall": _share(sel, "detected"), "kind_ok": _kind_ok(sel),
                           "recovered_within_5s": _share(sel, "recovered_within_5s")}
    per_wl = {}
    for w in sorted({e["workload"] for e in events}):
        sel = [e for e in events if e["workload"] == w]
        per_wl[w] = {"events": len(sel), "recall": _share(sel, "detected")}
    return {"per_magnitude": per_mag, "per_kind": per_kind, "per_workload": per_wl}


def score(results: list[dict], config=None) -> dict:
    """The simulated suite's figures from its runs' changes and truth."""
    from dynamiccl.detector.config import DetectorConfig

    cfg = config or DetectorConfig()
    t = _Tally()
    for res in results:
        _score_run(res, t, cfg)
    events = t.events
    n_changes = t.tp + t.fp
    out = {"events": events, "false_positive_changes": t.fp_changes[:50]}
    out["precision"] = t.tp / n_changes if n_changes else 1.0
    out["recall"] = _share(events, "detected") if events else float("nan")
    ratios = [e["delay_ratio"] for e in events if e.get("delay_ratio") is not None]
    out["delay_ratio_median"] = statistics.median(ratios) if ratios else float("nan")
    out["false_alarms_per_day"] = t.stationary_fa / t.stationary_hours * 24.0 if t.stationary_hours else float("nan")
    out["stationary_hours"] = t.stationary_hours
    out["stationary_false_alarms"] = t.stationary_fa
    out["stationary_changes"] = t.stationary_changes
    strag = [e for e in events if e["kind"] == "straggler"]
    out["straggler_top1"] = sum(e.get("top1", False) for e in strag) / len(strag) if strag else float("nan")
    out["recovery_recall"] = t.rec_hit / t.rec_total if t.rec_total else float("nan")
    out["kind_accuracy"] = _kind_ok(events)
    out.update(_tables(events))
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
