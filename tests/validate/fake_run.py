"""A synthetic validate-nccl run folder: what a healthy real run leaves, records made to match.

``fake_run(out, breakage)`` writes run.json, env.json, events.npy and rank 0's NCCL log for a
2-rank job, then applies one named breakage so each check can be shown to fail.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from dynamiccl.collector.wire_format import ALGOS, EVENT_DTYPE, FUNCS, PROTOS, EventFlags, Kind, TimingSource
from dynamiccl.validate.cli import make_spec

DEFAULT = ("RING", "LL128", 2)      # "NCCL's" choice for every collective in the fake run


def _calls(spec: dict) -> list[tuple[str, str, int, int]]:
    """(phase, func, bytes, tuner version) in issue order."""
    out = []
    for func in ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "SendRecv"):
        for size in spec["sizes"]:
            out += [("warmup", func, size, 0)] + [("sweep", func, size, 0)] * spec["reps"]
    nb = spec["tuned_bytes"]
    for v in spec["tuner_versions"]:
        out += [(f"tuner_v{v['version']}", "AllReduce", nb, v["version"])] * 5
        out += [(f"tuner_v{v['version']}", "AllGather", nb, v["version"])] * 5
    last = spec["tuner_versions"][-1]["version"]
    for step in range(spec["reload"]["steps"]):
        v = spec["reload"]["version"]["version"] if step > spec["reload"]["write_at_step"] else last
        out += [(f"reload_step{step}_v{v}", "AllReduce", nb, v)] * 4
    return out


def _a2a_calls(spec: dict) -> list[tuple[str, str, int, int]]:
    out = []
    for size in spec["sizes"]:
        out += [("warmup", "AlltoAll", size, 0)] + [("a2a", "AlltoAll", size, 0)] * spec["reps"]
    return out + [("after_a2a", "AllReduce", spec["slow"]["bytes"], 0)] * 10


def _slow_calls(spec: dict, t0: int, rank: int, rng: np.random.Generator) -> list[list]:
    """The slow-rank phase: 15 s steady, then every rank but the slow one waits 3x as long."""
    s, out, t = spec["slow"], [], t0
    for i in range(int((s["base_s"] + s["slow_s"]) / 0.02)):
        after = i * 0.02 >= s["base_s"]
        dur = 400.0 * (1 + 0.03 * rng.standard_normal()) * (3.0 if after and rank != s["slow_rank"] else 1.0)
        out.append(["slow_after" if after else "slow_before", "AllReduce", s["bytes"], t, dur + 3.0, dur + 1.0])
        t += 20_000_000
    return out


def _choice(spec: dict, func: str, version: int) -> tuple[str, str, int]:
    allv = spec["tuner_versions"] + [spec["reload"]["version"]]
    rule = next((v["rules"][0] for v in allv if v["version"] == version), None)
    if func == "AllReduce" and rule is not None:
        return rule["algo"], rule["proto"], rule["n_channels"]
    return DEFAULT


def _records(spec: dict, rank: int, ranks: int, call: list, version: int, seq: int, log: list) -> list:
    """The records one call leaves on ``rank`` (and rank 0's TUNING line for a collective)."""
    phase, func, nb, t, _cuda, dur_us = call
    algo, proto, ch = _choice(spec, func, version)
    kinds = [(func, Kind.COLL, 0)]
    if func == "SendRecv":
        kinds = [("Send", Kind.P2P, (rank + 1) % ranks), ("Recv", Kind.P2P, (rank - 1) % ranks)]
    elif func == "AlltoAll":
        kinds = [(n, Kind.P2P, p) for p in range(ranks) for n in ("Send", "Recv")]
    out = []
    for name, kind, peer in kinds:
        r = np.zeros(1, EVENT_DTYPE)
        r["kind"], r["func"], r["rank"], r["nranks"], r["pid"] = kind, FUNCS.index(name), rank, ranks, 1000 + rank
        if kind == Kind.COLL:
            r["algo"], r["proto"], r["n_channels"] = ALGOS.index(algo), PROTOS.index(proto), ch
            if rank == 0:
                log.append(f"h:1000:1 [0] NCCL INFO {func}: {nb} Bytes -> Algo {algo} proto {proto} "
                           f"channel{{Lo..Hi}}={{0..{ch - 1}}}")
        else:
            r["algo"] = r["proto"] = 255
            r["root"] = peer
        r["bytes"], r["count"], r["seq_number"], r["comm_hash"] = nb, nb // 4, seq, 0x1234
        r["enqueue_ns"], r["gpu_start_ns"] = t + 2_000, t + 5_000
        r["gpu_end_ns"] = t + 5_000 + int(dur_us * 1e3)
        r["timing_source"], r["tuner_config_version"] = TimingSource.KERNEL_GPU, version
        if kind == Kind.P2P and peer == rank:       # send/recv to self: no KernelCh in NCCL
            r["timing_source"], r["gpu_start_ns"], r["gpu_end_ns"] = TimingSource.NONE, 0, 0
        out.append(r)
    return out


def fake_run(out: str, breakage: str | None = None, ranks: int = 2) -> str:
    args = argparse.Namespace(max_bytes=1 << 20, reps=2)
    spec = make_spec(args, ranks)
    t0 = 1_800_000_000_000_000_000
    results, recs, log = [], [], []
    for rank in range(ranks):
        calls, t, seq = [], t0, 0
        for phase, func, nb, version in _calls(spec):
            dur_us = 50.0 + nb / 1e4
            calls.append([phase, func, nb, t, dur_us + 3.0, dur_us + 1.0])
            recs += _records(spec, rank, ranks, calls[-1], version, seq, log)
            seq += func not in ("SendRecv", "AlltoAll")
            t += 1_000_000
        slow = _slow_calls(spec, t, rank, np.random.default_rng(rank))
        marks = {"slow_start_ns": t, "slow_end_ns": slow[-1][3] + 10_000_000,
                 "slow_onset_ns": t + int(spec["slow"]["base_s"] * 1e9)}
        for c in slow:
            calls.append(c)
            recs += _records(spec, rank, ranks, c, 0, seq, log)
            seq += 1
        t = slow[-1][3] + 100_000_000
        for phase, func, nb, version in _a2a_calls(spec):
            dur_us = 50.0 + nb / 1e4
            calls.append([phase, func, nb, t, dur_us + 3.0, dur_us + 1.0])
            recs += _records(spec, rank, ranks, calls[-1], version, seq, log)
            seq += func != "AlltoAll"
            t += 1_000_000
        results.append({"rank": rank, "pid": 1000 + rank, "world": ranks, "calls": calls,
                        "cols": ["phase", "func", "bytes", "t_ns", "cuda_us", "nccl_us"], "marks": marks})
    for i in range(10):                      # what the overhead launch with the plugins emitted
        r = np.zeros(1, EVENT_DTYPE)
        r["kind"], r["func"], r["pid"], r["nranks"], r["timing_source"] = Kind.COLL, FUNCS.index("AllReduce"), 5001, 1, 1
        r["enqueue_ns"] = r["gpu_start_ns"] = r["gpu_end_ns"] = t0 - 10_000_000_000 + i
        recs.append(r)
    events = np.concatenate(recs)
    _break(breakage, events, results, log)
    pids = [r["pid"] for r in results] + [5001]
    stats = {str(p): {"records_sent": int(np.sum(events["pid"] == p)),
                      "records_emitted": int(np.sum(events["pid"] == p)),
                             "records_undelivered": 0, "records_dropped_ring_full": 0,
                             "events_dropped_pool_full": 0, "events_stale": 0} for p in pids}
    overhead = {"1048576": [100.0, 101.0], "67108864": [900.0, 905.0]}
    launches = [{"name": "main", "phases": ["sweep", "tuner", "reload", "slow"], "plugins": True, "ok": True,
                 "timed_out": False, "returncodes": [0] * ranks, "wall_s": 10.0, "results": results,
                 "stderr_tail": ""}]
    for name, plugins in (("bare0", False), ("plug0", True)):
        scale = 1.01 if plugins else 1.0
        launches.append({"name": name, "phases": ["overhead"], "plugins": plugins, "ok": True,
                         "timed_out": False, "returncodes": [0] * ranks, "wall_s": 5.0, "stderr_tail": "",
                         "results": [{"rank": 0, "pid": 5000 + plugins, "calls": [], "cols": [],
                                      "marks": {"overhead_us": {k: [x * scale for x in v] for k, v in overhead.items()}}}]})
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump({"stats": stats, "hosts": {}, "protocol_errors": [], "connections": ranks, "launches": launches}, f)
    with open(os.path.join(out, "env.json"), "w") as f:
        json.dump({"nccl": "2.28.9", "spec": spec, "ranks": ranks}, f)
    np.save(os.path.join(out, "events.npy"), events)
    with open(os.path.join(out, "nccl.main.1000.log"), "w") as f:
        f.write("h:1000:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n")
        f.write("h:1000:1 [0] NCCL INFO PROFILER/Plugin: Loaded dynamiccl (v6)\n")
        f.write("h:1000:1 [0] NCCL INFO TUNER/Plugin: Using dynamiccl (v5)\n")
        f.write("\n".join(log) + "\n")
    with open(os.path.join(out, "nccl.main.1001.log"), "w") as f:
        f.write("h:1001:1 [1] NCCL INFO PROFILER/Plugin: Loaded dynamiccl (v6)\n")
        f.write("h:1001:1 [1] NCCL INFO TUNER/Plugin: Using dynamiccl (v5)\n")
    return out


def _break(breakage: str | None, events: np.ndarray, results: list[dict], log: list[str]) -> None:
    if breakage is None:
        return
    if breakage == "stale":                  # a record whose KernelCh children never came
        events["timing_source"][3] = TimingSource.NONE
    elif breakage == "slow_timer":           # the profiler's GPU time 50 % off the CUDA events
        sweep = events["func"] == FUNCS.index("Broadcast")
        events["gpu_end_ns"][sweep] += ((events["gpu_end_ns"][sweep] - events["gpu_start_ns"][sweep]) // 2)
    elif breakage == "log_mismatch":         # NCCL says TREE where the record says RING
        log[5] = log[5].replace("Algo RING", "Algo TREE")
    elif breakage == "counter_divergence":   # KernelCh times of the calls after the all-to-all: another kernel's
        r0 = next(r for r in results if r["rank"] == 0)
        after = min(c[3] for c in r0["calls"] if c[0] == "after_a2a")
        late = (events["enqueue_ns"] > after) & (events["rank"] == 0)
        events["gpu_start_ns"][late] -= 900_000_000
    elif breakage == "divergence_flagged":   # the plugin's order guard caught it: untimed and flagged
        r0 = next(r for r in results if r["rank"] == 0)
        after = min(c[3] for c in r0["calls"] if c[0] == "after_a2a")
        late = (events["enqueue_ns"] > after) & (events["rank"] == 0)
        events["timing_source"][late] = TimingSource.NONE
        events["flags"][late] |= EventFlags.TIMING_SUSPECT
    elif breakage in ("api_broadcast", "api_choice"):  # NCCL 2.29+: Broadcast with no Coll event, API-level records
        bc = events["func"] == FUNCS.index("Broadcast")
        events["timing_source"][bc] = TimingSource.NONE
        events["flags"][bc] |= EventFlags.API_LEVEL
        events["algo"][bc] = events["proto"][bc] = 255
        events["n_channels"][bc] = events["gpu_start_ns"][bc] = events["gpu_end_ns"][bc] = 0
        if breakage == "api_choice":         # and an ordinary record disagrees with its line
            log[5] = log[5].replace("Algo RING", "Algo TREE")
    elif breakage == "split_switch":         # rank 1 applies the mid-run version one collective late
        ix = np.flatnonzero((events["rank"] == 1) & (events["tuner_config_version"] == 3))[0]
        events["tuner_config_version"][ix] = 2
    else:
        raise ValueError(breakage)
