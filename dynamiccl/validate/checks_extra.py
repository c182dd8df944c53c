"""Checks of the extra launches (extras.py): the TSC record clock, per-peer network timing and a
chained profiler. Inputs are what the launches left in the run's folder, so ``--analyse`` reruns
them anywhere. Standard library and numpy only.
"""
from __future__ import annotations

import glob
import os
import re
import statistics

import numpy as np

from dynamiccl.collector.wire_format import ALGOS, PROTOS, Kind

from .checks import Check

__all__ = ["extra_checks", "check_clock", "check_peers", "check_chain", "PEER_BYTES_REL", "LAG_TOL_US"]

LAG_TOL_US = 20.0          # a host stop may follow the next call's start by this much (the proxy sees stops late)
PEER_BYTES_REL = 0.10      # RING/SIMPLE AllReduce: bytes each way = 2 (n - 1) / n x the buffer, within 10 %
PEER_COVERAGE = 0.9        # share of a rank's collectives that must carry PEER records in both directions
_PROBE_LINE = re.compile(r"chain_probe: (.*)")
_TSC_REFUSED = "needs an invariant TSC"


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def _probe_calls(res: dict) -> np.ndarray:
    ix = {c: i for i, c in enumerate(res["cols"])}
    return np.array([c[ix["t_ns"]] for c in res["calls"] if c[ix["phase"]] == "probe"], np.int64)


def _colls(events: np.ndarray, pid: int) -> np.ndarray:
    mine = events[(events["pid"] == pid) & (events["kind"] == Kind.COLL)]
    one_comm = len(np.unique(mine["comm_hash"])) <= 1
    return mine[np.argsort(mine["seq_number"] if one_comm else mine["enqueue_ns"], kind="stable")]


def _clock_side(results: list[dict], events: np.ndarray) -> dict:
    """Each record against the worker's clock around its call: the enqueue follows the call's own clock
    read (same thread), and the host stop normally precedes the next call's (the worker waits for the
    GPU). How far each holds bounds the record clock's error against CLOCK_REALTIME."""
    lead, lag, unpaired, backwards, before, after = [], [], [], 0, 0, 0
    lead_med, starts, enqs = [], [], []
    for res in results:
        t, recs = _probe_calls(res), _colls(events, res["pid"])
        backwards += int(np.sum((recs["cpu_end_ns"] > 0) & (recs["cpu_end_ns"] < recs["enqueue_ns"])))
        if len(t) != len(recs) or len(t) < 2:
            unpaired.append(f"rank {res['rank']}: {len(t)} calls, {len(recs)} records")
            continue
        enq, end = recs["enqueue_ns"].astype(np.int64), recs["cpu_end_ns"].astype(np.int64)
        starts.append(t)
        enqs.append(enq)
        lead.append((enq - t) / 1e3)                      # >= 0 unless the record clock is behind
        lead_med.append(round(float(np.median(lead[-1]))))
        timed = end[:-1] > 0
        lag.append((end[:-1][timed] - t[1:][timed]) / 1e3)  # <= 0 unless the clock is ahead (or the proxy late)
        before += int(np.sum(enq < t))
        after += int(np.sum(lag[-1] > LAG_TOL_US))
    recs = events[np.isin(events["pid"], [r["pid"] for r in results]) & (events["kind"] == Kind.COLL)]
    lead_a = np.concatenate(lead) if lead else np.zeros(0)
    lag_a = np.concatenate(lag) if lag else np.zeros(0)
    return {"records": int(len(recs)), "backwards": backwards, "unpaired": unpaired,
            "enqueue_before_call": before, "end_after_next_call": after,
            "behind_bound_us": float(lead_a.min()) if len(lead_a) else float("nan"),
            "ahead_bound_us": float(-lag_a.max()) if len(lag_a) else float("nan"),
            "spread_med_us": _spread(enqs), "lead_med_us": lead_med, "call_spread_med_us": _spread(starts)}


def _spread(times: list[np.ndarray]) -> float:
    """Median over calls of the ranks' spread in call i's times (us): the workers' starts or the records'
    enqueues, one array per rank in call order."""
    if not times or len({len(t) for t in times}) != 1:
        return float("nan")
    t = np.array(times)
    return float(np.median(t.max(axis=0) - t.min(axis=0)) / 1e3)


def check_clock(ref: list[dict], tsc: list[dict], events: np.ndarray, tsc_logs: list[str]) -> Check:
    """Every TSC-clock record inside its call as the worker's own CLOCK_REALTIME saw it: enqueued after
    the call began (strict: the same thread), its host stop at most LAG_TOL_US after the next call
    began (the proxy thread sees a stop late), and not before its enqueue. A clock off by more than
    the calls' slack (tens to hundreds of us) breaks one of these; smaller errors are below this test's
    resolution."""
    name = "7 record clock (DYNAMICCL_CLOCK=1)"
    if not ref or not tsc:
        return Check(name, False, "the probe_ref or probe_tsc launch left no results")
    if any(_TSC_REFUSED in text for text in tsc_logs):
        return Check(name, None, "this host has no invariant TSC: the plugin kept clock_gettime (its warning is "
                     "in the probe_tsc NCCL logs)")
    a, b = _clock_side(ref, events), _clock_side(tsc, events)
    ok = (not a["unpaired"] and not b["unpaired"] and b["backwards"] == 0 and b["enqueue_before_call"] == 0
          and b["end_after_next_call"] == 0)
    fmt = lambda s: (f"{s['records']} records, {s['enqueue_before_call']} enqueued before their call, "  # noqa: E731
                     f"{s['end_after_next_call']} stopped > {LAG_TOL_US:g} us after the next call began, "
                     f"{s['backwards']} with cpu_end < enqueue; slack -{s['behind_bound_us']:.0f}/"
                     f"+{s['ahead_bound_us']:.0f} us; enqueue - call start median per rank {s['lead_med_us']} us")
    return Check(name, ok, f"default clock: {fmt(a)}; TSC clock: {fmt(b)}. Cross-rank spread of a call's "
                 f"records, reported only (ranks sharing a GPU start calls time slices apart): default "
                 f"{a['spread_med_us']:.0f} us (the calls' own, by the workers' clock: {a['call_spread_med_us']:.0f}), "
                 f"TSC {b['spread_med_us']:.0f} us (calls {b['call_spread_med_us']:.0f})",
                 {"default": a, "tsc": b}, a["unpaired"] + b["unpaired"])


def _peer_sums(peers: np.ndarray, pid: int) -> dict:
    """(comm_hash, seq_number) -> [bytes sent, bytes received, rows, state_ns sums (6)] of one process."""
    out: dict = {}
    for p in peers[peers["pid"] == pid]:
        s = out.setdefault((int(p["comm_hash"]), int(p["seq_number"])), [0, 0, 0, np.zeros(6)])
        s[0 if p["is_send"] else 1] += int(p["bytes"])
        s[2] += 1
        s[3][(0 if p["is_send"] else 3):(3 if p["is_send"] else 6)] += p["state_ns"]
    return out


def check_peers(results: list[dict], events: np.ndarray, peers: np.ndarray, shared: bool) -> Check:
    name = "8 per-peer timing (DYNAMICCL_EVENT_MASK=94)"
    if not results:
        return Check(name, False, "the probe_peer launch left no results")
    if not shared and not len(peers):
        return Check(name, None, "ranks on their own GPUs of one node: NCCL runs no proxy steps (P2P/SHM), "
                     "so no PEER record is expected")
    cells: dict = {}
    rows, ok = [], True
    for res in results:
        recs, sums = _colls(events, res["pid"]), _peer_sums(peers, res["pid"])
        both = 0
        for r in recs:
            s = sums.get((int(r["comm_hash"]), int(r["seq_number"])))
            if s is None or not s[0] or not s[1]:
                continue
            both += 1
            n = int(r["nranks"])
            want = 2 * (n - 1) / n * int(r["bytes"])
            key = (int(r["bytes"]), ALGOS[r["algo"]] if r["algo"] < len(ALGOS) else "?",
                   PROTOS[r["proto"]] if r["proto"] < len(PROTOS) else "?")
            cells.setdefault(key, []).append((s[0] / want, s[1] / want, s[3] / 1e3))
        cover = both / len(recs) if len(recs) else 0.0
        ok &= cover >= PEER_COVERAGE
        peers_of = sorted(set(peers[peers["pid"] == res["pid"]]["peer"].tolist()))
        rows.append(f"rank {res['rank']}: {both}/{len(recs)} collectives with PEER records both ways; peers {peers_of}")
    for (nb, algo, proto), v in sorted(cells.items()):
        send, recv = statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)
        states = np.median(np.array([x[2] for x in v]), axis=0)
        if algo == "RING" and proto == "SIMPLE":
            ok &= abs(send - 1) <= PEER_BYTES_REL and abs(recv - 1) <= PEER_BYTES_REL
        rows.append(f"AllReduce {nb} B {algo}/{proto}: {len(v)} records, bytes / (2(n-1)/n x buffer) sent "
                    f"{send:.3f} received {recv:.3f}; median us in states send [gpu wait, peer wait, wait] "
                    f"{states[:3].round(1).tolist()} receive [wait, flush wait, gpu wait] {states[3:].round(1).tolist()}")
    ok &= bool(cells)
    return Check(name, ok, f"{len(peers)} PEER records; every rank's collectives carry them both ways "
                 f"(>= {PEER_COVERAGE:.0%}) and RING/SIMPLE bytes match the ring's traffic within "
                 f"{PEER_BYTES_REL:.0%}: {ok}", {"peer_records": int(len(peers))}, rows)


def _probe_counts(out: str, launch: str, ranks: int) -> list[dict | None]:
    counts: list[dict | None] = []
    for r in range(ranks):
        path = os.path.join(out, f"worker.{launch}.rank{r}.log")
        found = _PROBE_LINE.findall(_read(path)) if os.path.exists(path) else []
        counts.append({k: int(v) for k, v in (kv.split("=") for kv in found[-1].split())} if found else None)
    return counts


def check_chain(out: str, ref: list[dict], chained: list[dict], ranks: int, events: np.ndarray) -> Check:
    name = "9 chained profiler (DYNAMICCL_PROFILER_CHAIN)"
    alone, both = _probe_counts(out, "probe_chainonly", ranks), _probe_counts(out, "probe_chained", ranks)
    rows, ok = [], len(ref) == len(chained) == ranks
    for r in range(ranks):
        a, b = alone[r], both[r]
        if a is None or b is None:
            rows.append(f"rank {r}: chain probe counts missing (alone {a is not None}, chained {b is not None})")
            ok = False
            continue
        same = all(a[k] == b[k] for k in ("starts", "stops", "states", "kch"))
        clean = b["bad_handles"] == b["foreign_parents"] == b["double_stops"] == 0 and b["kch_parent_ok"] == b["kch"]
        ok &= same and clean
        rows.append(f"rank {r}: probe alone {a}; chained {b}; equal: {same}; handles clean: {clean}")
    for x, y in zip(sorted(ref, key=lambda d: d["rank"]), sorted(chained, key=lambda d: d["rank"])):
        nx, ny = len(_colls(events, x["pid"])), len(_colls(events, y["pid"]))
        ok &= nx == ny and nx > 0
        rows.append(f"rank {x['rank']}: DynamICCL COLL records alone {nx}, chained {ny}")
    logged = [p for y in chained for p in glob.glob(os.path.join(out, f"nccl.probe_chained.{y['pid']}.log"))
              if "chained to" in _read(p)]
    ok &= len(logged) == len(chained)
    return Check(name, ok, f"the chain probe's counts equal alone and behind DynamICCL, DynamICCL's records "
                 f"equal with and without it, {len(logged)}/{len(chained)} ranks log 'chained to': {ok}", {}, rows)


def extra_checks(out: str, launches: list[dict], events: np.ndarray, peers: np.ndarray, shared: bool) -> list[Check]:
    by = {la["name"]: sorted(la["results"], key=lambda r: r["rank"]) for la in launches}
    if "probe_ref" not in by:
        return []
    logs = [_read(p) for pattern in ("nccl.probe_tsc.*.log", "worker.probe_tsc.rank*.log")
            for p in glob.glob(os.path.join(out, pattern))]
    checks = [check_clock(by["probe_ref"], by.get("probe_tsc", []), events, logs),
              check_peers(by.get("probe_peer", []), events, peers, shared)]
    if "probe_chained" in by:
        checks.append(check_chain(out, by["probe_ref"], by["probe_chained"], len(by["probe_ref"]), events))
    else:
        checks.append(Check("9 chained profiler (DYNAMICCL_PROFILER_CHAIN)", None, "the chain probe could not be built"))
    return checks
