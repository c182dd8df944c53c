"""Run every check on a run's folder (what the launches left there) and write the reports.

Used at the end of a live run and by ``--analyse DIR`` on a copied folder, on any machine.
"""
from __future__ import annotations

import glob
import json
import os
import statistics

import numpy as np

from .checks import (Check, check_after_self_send, check_delivery, check_overhead, check_records, check_tuner, check_tuning_log,
                     check_versions)
from .checks_extra import extra_checks
from .detect import check_detection
from .extras import uses_other_profiler
from .nccl_log import parse_file
from .report import write_reports

__all__ = ["analyse", "load_run"]


def load_run(out: str) -> tuple[dict, dict, np.ndarray]:
    with open(os.path.join(out, "run.json")) as f:
        run = json.load(f)
    with open(os.path.join(out, "env.json")) as f:
        env = json.load(f)
    return run, env, np.load(os.path.join(out, "events.npy"))


def load_peers(out: str) -> np.ndarray:
    """The run's PEER records (runs saved before the extras have none)."""
    from dynamiccl.collector.wire_format import PEER_DTYPE
    path = os.path.join(out, "peers.npy")
    return np.load(path) if os.path.exists(path) else np.zeros(0, PEER_DTYPE)


def _overhead_samples(launches: list[dict], metric: str) -> dict:
    """One median per launch and rank of ``metric`` (``overhead_us``: time per collective;
    ``enqueue_us``: the application thread's time per enqueue), by side and size."""
    samples: dict = {"with": {}, "without": {}}
    for la in launches:
        if "overhead" not in la["phases"] or not la["ok"]:
            continue
        side = samples["with" if la["plugins"] else "without"]
        for res in la["results"]:
            for size, rounds in res["marks"].get(metric, {}).items():
                side.setdefault(size, []).append(statistics.median(rounds))
    return samples


def _launch_check(launches: list[dict]) -> Check:
    bad = [la for la in launches if not la["ok"]]
    rows = [f"{la['name']}: rc {la['returncodes']}, {la['wall_s']:.0f} s"
            f"{' (timed out: ranks hung)' if la['timed_out'] else ''}" for la in launches]
    rows += [f"{la['name']} rank 0 output tail: {la['stderr_tail'][-800:]}" for la in bad]
    return Check("0 launches", not bad, f"{len(launches) - len(bad)}/{len(launches)} launches ended cleanly, "
                 f"no rank hung: {not any(la['timed_out'] for la in launches)}", {}, rows)


def analyse(out: str) -> bool:
    run, env, events = load_run(out)
    launches = run["launches"]
    main = launches[0]
    results = sorted(main["results"], key=lambda r: r["rank"])
    checks = [_launch_check(launches)]
    pids = {r["pid"]: r["rank"] for r in results}
    logs = {pid: parse_file(p) for pid in pids
            for p in glob.glob(os.path.join(out, f"nccl.{main['name']}.{pid}.log"))}
    checks.append(check_versions(env.get("nccl", "?"), list(logs.values())))
    if results:
        checks.append(check_records(results, events))
        if any(c[0] == "after_a2a" for c in results[0]["calls"]):
            checks.append(check_after_self_send(results, events))
        rank0 = results[0]
        if rank0["pid"] in logs:
            checks.append(check_tuning_log(rank0, events, logs[rank0["pid"]]))
        else:
            checks.append(Check("3 NCCL's choice", False, "no NCCL debug log from rank 0"))
        checks.append(check_tuner(results, events, env["spec"], main["ok"]))
    metric = env["spec"]["overhead"].get("metric", "overhead_us")
    plug_pids = [r["pid"] for la in launches if la["plugins"] and not uses_other_profiler(la) for r in la["results"]]
    peers = load_peers(out)
    exercised = sum(int(run["stats"].get(str(r["pid"]), {}).get("records_sent", 0))
                    for la in launches if la["plugins"] and "overhead" in la["phases"] for r in la["results"])
    if env["spec"]["overhead"].get("skip"):
        checks.append(Check("5 overhead", None, "not measured in this run (--no-overhead)"))
    else:
        checks.append(check_overhead(_overhead_samples(launches, metric), metric, exercised))
    checks.append(check_delivery(events, {int(k): v for k, v in run["stats"].items()}, plug_pids, peers))
    if results:
        slow = events[np.isin(events["pid"], list(pids))]
        marks = results[0]["marks"]
        slow = slow[(slow["enqueue_ns"] >= marks.get("slow_start_ns", 0)) & (slow["enqueue_ns"] <= marks.get("slow_end_ns", 0))]
        checks.append(check_detection(slow, {int(k): v for k, v in run["hosts"].items()},
                                      int(marks.get("slow_onset_ns", 0)), env["spec"]["slow"]["slow_rank"]))
    checks += extra_checks(out, launches, events, peers, bool(env.get("plan_note")) and "share" in env["plan_note"])
    ok = write_reports(out, env, checks)
    for c in checks:
        print(f"validate-nccl: [{c.status}] {c.name}: {c.summary}", flush=True)
    print(f"validate-nccl: {'PASS' if ok else 'FAIL'}; report in {os.path.join(out, 'report.md')}", flush=True)
    return ok
