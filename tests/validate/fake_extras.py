"""The extra launches (validate/extras.py) added to a synthetic run folder from ``fake_run``:
records, PEER records, chain-probe counts and NCCL log lines as a healthy plugin leaves them, then
one named breakage so each extra check can be shown to fail."""
from __future__ import annotations

import json
import os

import numpy as np

from dynamiccl.collector.wire_format import ALGOS, EVENT_DTYPE, FUNCS, PEER_DTYPE, PROTOS, Kind, TimingSource
from dynamiccl.validate.extras import PROBE

LAUNCHES = ("probe_ref", "probe_tsc", "probe_peer", "probe_chainonly", "probe_chained")
PROBE_COUNTS = "chain_probe: starts=600 stops=600 states=480 kch=480 kch_parent_ok=480 bad_handles=0 " \
               "foreign_parents=0 double_stops=0"


def _probe_records(pid: int, rank: int, ranks: int, t0: int) -> tuple[list, list]:
    calls, recs, seq = [], [], 0
    for size, n in PROBE["sizes"]:
        for _ in range(n):
            t = t0 + seq * 1_000_000
            calls.append(["probe", "AllReduce", size, t, 80.0, 78.0])
            r = np.zeros(1, EVENT_DTYPE)
            r["kind"], r["func"], r["rank"], r["nranks"], r["pid"] = Kind.COLL, FUNCS.index("AllReduce"), rank, ranks, pid
            r["algo"], r["n_channels"] = ALGOS.index("RING"), 2
            r["proto"] = PROTOS.index("SIMPLE" if size >= (1 << 20) else "LL")
            r["bytes"], r["count"], r["seq_number"], r["comm_hash"] = size, size // 4, seq, 0x77
            r["enqueue_ns"] = t + 3_000 + 1_000 * rank
            r["gpu_start_ns"], r["gpu_end_ns"], r["cpu_end_ns"] = t + 5_000, t + 83_000, t + 90_000
            r["timing_source"] = TimingSource.KERNEL_GPU
            recs.append(r)
            seq += 1
    return calls, recs


def _peer_rows(recs: list, rank: int, ranks: int) -> list:
    rows = []
    for r in recs:
        for is_send, peer in ((1, (rank + 1) % ranks), (0, (rank - 1) % ranks)):
            p = np.zeros(1, PEER_DTYPE)
            p["kind"], p["is_send"], p["pid"], p["rank"], p["peer"] = 6, is_send, r["pid"], rank, peer
            p["comm_hash"], p["seq_number"], p["enqueue_ns"] = r["comm_hash"], r["seq_number"], r["enqueue_ns"]
            p["proxy_ops"], p["steps"] = 2, 8
            p["bytes"] = int(2 * (ranks - 1) / ranks * int(r["bytes"][0]))
            p["state_ns"] = [1_000, 2_000, 30_000]
            rows.append(p)
    return rows


def add_extras(out: str, breakage: str | None = None) -> str:
    with open(os.path.join(out, "run.json")) as f:
        run = json.load(f)
    with open(os.path.join(out, "env.json")) as f:
        env = json.load(f)
    ranks = env["ranks"]
    events, peers = [np.load(os.path.join(out, "events.npy"))], []
    env["plan_note"] = f"{ranks} ranks share 1 GPU(s) (one NCCL_HOSTID per rank)"
    for k, name in enumerate(LAUNCHES):
        results = []
        for rank in range(ranks):
            pid = 6000 + 10 * k + rank
            calls, recs = _probe_records(pid, rank, ranks, 1_900_000_000_000_000_000 + k * 10**12)
            mine = [] if name == "probe_chainonly" else recs
            rows = _peer_rows(recs, rank, ranks) if name == "probe_peer" else []
            events += mine
            peers += rows
            results.append({"rank": rank, "pid": pid, "world": ranks, "calls": calls, "marks": {},
                            "cols": ["phase", "func", "bytes", "t_ns", "cuda_us", "nccl_us"]})
            if name != "probe_chainonly":
                n = len(mine) + len(rows)
                run["stats"][str(pid)] = {"records_sent": n, "records_emitted": n, "records_undelivered": 0,
                                          "records_dropped_ring_full": 0, "events_dropped_pool_full": 0,
                                          "events_stale": 0}
            if name in ("probe_chainonly", "probe_chained"):
                with open(os.path.join(out, f"worker.{name}.rank{rank}.log"), "w") as f:
                    f.write(PROBE_COUNTS + "\n")
            with open(os.path.join(out, f"nccl.{name}.{pid}.log"), "w") as f:
                f.write(f"h:{pid}:1 [{rank}] NCCL INFO DynamICCL profiler (v5): comm 77 rank {rank}\n")
                if name == "probe_chained":
                    f.write(f"h:{pid}:1 [{rank}] NCCL INFO DynamICCL profiler: chained to /x/libchain-probe.so "
                            "(chain_probe, v5)\n")
        run["launches"].append({"name": name, "phases": ["probe"], "plugins": True, "ok": True, "timed_out": False,
                                "returncodes": [0] * ranks, "wall_s": 3.0, "results": results, "stderr_tail": "",
                                "env": {"NCCL_PROFILER_PLUGIN": "/x"} if name == "probe_chainonly" else {}})
    events_a, peers_a = np.concatenate(events), np.concatenate(peers)
    _break(breakage, out, run, events_a, peers_a)
    np.save(os.path.join(out, "events.npy"), events_a)
    np.save(os.path.join(out, "peers.npy"), peers_a)
    with open(os.path.join(out, "run.json"), "w") as f:
        json.dump(run, f)
    with open(os.path.join(out, "env.json"), "w") as f:
        json.dump(env, f)
    return out


def _pids(run: dict, name: str) -> list[int]:
    return [r["pid"] for la in run["launches"] if la["name"] == name for r in la["results"]]


def _break(breakage: str | None, out: str, run: dict, events: np.ndarray, peers: np.ndarray) -> None:
    if breakage is None:
        return
    if breakage == "tsc_offset":        # the TSC clock 1 ms behind CLOCK_REALTIME
        events["enqueue_ns"][np.isin(events["pid"], _pids(run, "probe_tsc"))] -= 1_000_000
    elif breakage == "tsc_refused":     # no invariant TSC on this host: the plugin warned and kept the vDSO
        pid = _pids(run, "probe_tsc")[0]
        with open(os.path.join(out, f"nccl.probe_tsc.{pid}.log"), "a") as f:
            f.write("NCCL WARN DynamICCL profiler: DYNAMICCL_CLOCK=1 needs an invariant TSC (constant_tsc, ...)\n")
    elif breakage == "peer_bytes":      # the plugin summed only half of the steps' bytes
        peers["bytes"] //= 2
    elif breakage == "chain_count":     # one event lost on its way to the chained profiler
        with open(os.path.join(out, "worker.probe_chained.rank1.log"), "w") as f:
            f.write(PROBE_COUNTS.replace("starts=600", "starts=599") + "\n")
    else:
        raise ValueError(breakage)
