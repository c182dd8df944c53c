"""The kit's checks, one function each: inputs in, a :class:`Check` (pass/fail, numbers) out.

Standard library and numpy only; every input is what a launch left behind (worker results,
records, STATS, NCCL's log), so the checks also run on a saved run (``--analyse DIR``).
"""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from dynamiccl.collector.wire_format import FUNCS, EventFlags, Kind

from .matching import match_calls, record_choice
from .nccl_log import NcclLog
from .owners import describe_offsets, owner_offsets

__all__ = ["Check", "check_versions", "check_records", "check_tuning_log", "check_tuner",
           "check_delivery", "check_overhead", "check_after_self_send", "TIMING_REL", "TIMING_ABS_US", "OVERHEAD_MAX"]

TIMING_REL, TIMING_ABS_US = 0.10, 20.0   # profiler vs CUDA events: within 10 % or 20 us
# phases whose calls are timed against CUDA events, and the label of their cells
TIMED_PHASES = {"sweep": "{func}", "a2a": "{func}", "slow_before": "{func} (slow-rank phase, before)",
                "slow_after": "{func} (slow-rank phase, after)"}
OVERHEAD_MAX = 1.05                      # time per collective with the plugins / without


@dataclass
class Check:
    name: str
    ok: bool | None                      # None: skipped (the reason is in summary)
    summary: str
    numbers: dict = field(default_factory=dict)
    details: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.ok]


def check_versions(torch_nccl: str, logs: list[NcclLog]) -> Check:
    version = next((lg.version for lg in logs if lg.version), None)
    prof = Counter(lg.profiler for lg in logs if lg.profiler)
    tun = Counter(lg.tuner for lg in logs if lg.tuner)
    ok = bool(prof) and bool(tun) and all(p[0] == "dynamiccl" for p in prof) and all(t[0] == "dynamiccl" for t in tun)
    ok = ok and sum(prof.values()) == len(logs) and sum(tun.values()) == len(logs)
    fmt = lambda c: ", ".join(f"{n} v{v} ({k} ranks)" for (n, v), k in c.items()) or "none"  # noqa: E731
    return Check("1 versions", ok, f"NCCL {version or torch_nccl} (torch reports {torch_nccl}); profiler "
                 f"{fmt(prof)}; tuner {fmt(tun)}",
                 {"nccl_version": version or torch_nccl, "profiler_abi": sorted({v for _, v in prof}),
                  "tuner_abi": sorted({v for _, v in tun}), "ranks_logged": len(logs)},
                 [w for lg in logs for w in lg.warnings][:10])


def check_records(results: list[dict], events: np.ndarray) -> Check:
    """One record per call per rank, complete with GPU timing, and that timing against CUDA events."""
    nranks = len(results)
    bad, incomplete, calls = [], 0, 0
    timing: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for res in results:
        for cr in match_calls(res, events, ("sweep", "warmup", "a2a", "slow_before", "slow_after")):
            calls += 1
            ok, why = cr.expected(nranks)
            if not ok:
                bad.append(f"rank {cr.rank} {cr.func} {cr.nbytes} B: {why}")
                continue
            if not cr.complete:
                incomplete += 1
                bad.append(f"rank {cr.rank} {cr.func} {cr.nbytes} B: record incomplete "
                           f"(timing {cr.records['timing_source'].tolist()}, flags {cr.records['flags'].tolist()})")
                continue
            if cr.phase in TIMED_PHASES and cr.gpu_us == cr.gpu_us:
                timing[(TIMED_PHASES[cr.phase].format(func=cr.func), cr.nbytes)].append((cr.gpu_us, cr.cuda_us))
    rows, worst = [], 0.0
    timing_bad = 0
    for (func, nb), pairs in sorted(timing.items()):
        prof = statistics.median(p for p, _ in pairs)
        cuda = statistics.median(c for _, c in pairs)
        tol = max(TIMING_REL * cuda, TIMING_ABS_US)
        dev = abs(prof - cuda)
        worst = max(worst, dev / tol)
        ok = dev <= tol
        timing_bad += not ok
        rows.append({"func": func, "bytes": nb, "profiler_us": round(prof, 2), "cuda_us": round(cuda, 2),
                     "ok": ok, "n": len(pairs)})
    ok = calls > 0 and not bad and timing_bad == 0
    summary = (f"{calls} calls on {nranks} ranks: {calls - len(bad)} with the expected records, "
               f"{incomplete} incomplete; GPU timing within 10 % / 20 us of CUDA events for "
               f"{len(rows) - timing_bad}/{len(rows)} (collective, size) cells (worst {worst:.2f}x the tolerance)")
    return Check("2 records", ok, summary, {"calls": calls, "bad_calls": len(bad), "incomplete": incomplete,
                                            "timing": rows, "timing_cells_failed": timing_bad,
                                            "worst_over_tolerance": round(worst, 3)}, bad[:20])


def check_tuning_log(rank0: dict, events: np.ndarray, log: NcclLog) -> Check:
    """algo/proto/channels of rank 0's COLL records equal NCCL's TUNING lines, as multisets."""
    mine = events[(events["pid"] == rank0["pid"]) & (events["kind"] == Kind.COLL)]
    # API-level records (NCCL 2.29+ ran the call with no Coll event) carry no choice: set aside with
    # one logged line each of the same collective and size (NCCL still logs the task it became)
    api_rows = (mine["flags"] & EventFlags.API_LEVEL) != 0
    api = Counter((FUNCS[int(r["func"])], int(r["bytes"])) for r in mine[api_rows])
    recs = Counter((FUNCS[int(r["func"])], int(r["bytes"]), *record_choice(r)) for r in mine[~api_rows])
    logged: Counter = Counter()
    for c in log.choices:
        if api[c[:2]] > 0:
            api[c[:2]] -= 1
        else:
            logged[c] += 1
    common = sum((recs & logged).values())
    total = max(sum(recs.values()), sum(logged.values()))
    ok = total > 0 and recs == logged
    diff = [f"records only: {k} x{v}" for k, v in (recs - logged).most_common(5)]
    diff += [f"NCCL log only: {k} x{v}" for k, v in (logged - recs).most_common(5)]
    aside = f"; {int(api_rows.sum())} API-level records and their lines set aside" if api_rows.any() else ""
    return Check("3 NCCL's choice", ok, f"{common} of {total} rank-0 collectives agree with NCCL's TUNING "
                 f"lines (algo, proto, channels); {sum(recs.values())} records, {sum(logged.values())} lines{aside}",
                 {"agree": common, "records": sum(recs.values()), "log_lines": sum(logged.values())}, diff)


def _choices(results: list[dict], events: np.ndarray, phases: tuple[str, ...], func: str,
             nbytes: int | None = None) -> list[tuple]:
    """(rank, algo, proto, channels, tuner version, seq_number) of ``func`` records in ``phases``."""
    out = []
    for res in results:
        for cr in match_calls(res, events, phases):
            if cr.func != func or (nbytes is not None and cr.nbytes != nbytes):
                continue
            out += [(cr.rank, *record_choice(r), int(r["tuner_config_version"]), int(r["seq_number"]))
                    for r in cr.records if FUNCS[int(r["func"])] == func and int(r["bytes"]) == cr.nbytes]
    return out


def _reload_phases(results: list[dict]) -> tuple[str, ...]:
    return tuple(sorted({c[0] for res in results for c in res["calls"] if c[0].startswith("reload_step")}))


def check_tuner(results: list[dict], events: np.ndarray, spec: dict, launch_ok: bool) -> Check:
    """Forced cells change NCCL's choice; a rule for a disabled cell changes nothing; a mid-run
    version switches every rank at one sequence number; no rank hung."""
    nb = spec["tuned_bytes"]
    details, ok = [], launch_ok
    default = Counter(c[1:4] for c in _choices(results, events, ("sweep",), "AllReduce", nb))
    ag_default = {c[1:3] for c in _choices(results, events, ("sweep",), "AllGather", nb)}
    differs = False
    for v in spec["tuner_versions"]:
        rule = v["rules"][0]
        want = (rule["algo"], rule["proto"], rule["n_channels"])
        got = _choices(results, events, (f"tuner_v{v['version']}",), "AllReduce", nb)
        hit = sum(1 for c in got if c[1:4] == want and c[4] == v["version"])
        differs |= want not in default
        ok &= bool(got) and hit == len(got)
        details.append(f"v{v['version']} forces AllReduce {nb} B to {want}: {hit}/{len(got)} records on "
                       f"{len({c[0] for c in got})} ranks")
        ag = _choices(results, events, (f"tuner_v{v['version']}",), "AllGather", nb)
        unchanged = sum(1 for c in ag if c[1:3] in ag_default)
        ok &= bool(ag) and unchanged == len(ag)
        details.append(f"v{v['version']} rule for a disabled AllGather cell: {unchanged}/{len(ag)} records "
                       f"kept NCCL's choice {sorted(ag_default)}")
    ok &= differs
    details.append(f"NCCL's own choice for AllReduce {nb} B: {dict(default)}")
    rv = spec["reload"]["version"]
    reload = _choices(results, events, _reload_phases(results), "AllReduce", nb)
    switch = {res["rank"]: min((c[5] for c in reload if c[0] == res["rank"] and c[4] == rv["version"]),
                               default=None) for res in results}
    rule = rv["rules"][0]
    after = [c for c in reload if c[4] == rv["version"]]
    applied = bool(after) and all(c[1:4] == (rule["algo"], rule["proto"], rule["n_channels"]) for c in after)
    same = len(set(switch.values())) == 1 and None not in switch.values()
    ok &= same and applied
    details.append(f"reload v{rv['version']} first applied at seq_number {switch} (one value = consistent); "
                   f"{len(after)} records after it carry its choice: {applied}")
    return Check("4 tuner", ok, f"forced versions applied on every rank and differ from NCCL's: "
                 f"{ok and differs}; mid-run switch at one sequence number on all ranks: {same}; "
                 f"every rank ended: {launch_ok}",
                 {"switch_seq": {str(k): v for k, v in switch.items()},
                  "default_allreduce": [list(k) for k in default]}, details)


def check_delivery(events: np.ndarray, stats: dict[int, dict[str, int]], pids: list[int],
                   peers: np.ndarray | None = None) -> Check:
    """Every record the plugins sent arrived (event and PEER records), and every record is sent or
    counted as dropped."""
    rows, ok = [], bool(pids)
    for pid in pids:
        got = int(np.sum(events["pid"] == pid)) + (int(np.sum(peers["pid"] == pid)) if peers is not None else 0)
        s = stats.get(pid)
        if s is None:
            rows.append(f"pid {pid}: {got} records, no STATS record")
            ok = False
            continue
        dropped = s["records_dropped_ring_full"] + s["records_undelivered"] + s["events_dropped_pool_full"]
        good = got == s["records_sent"] and s["records_emitted"] == s["records_sent"] + s["records_undelivered"]
        ok &= good
        rows.append(f"pid {pid}: received {got}, sent {s['records_sent']}, emitted {s['records_emitted']}, "
                    f"dropped {dropped}, stale {s['events_stale']}")
    total = int(sum(np.sum(events["pid"] == p) for p in pids)) + (int(np.isin(peers["pid"], pids).sum())
                                                                  if peers is not None else 0)
    return Check("6a delivery", ok, f"{total} records received from {len(pids)} processes; every record "
                 f"sent arrived and every drop is counted: {ok}", {"received": total}, rows)


OVERHEAD_METRICS = {"overhead_us": "time per AllReduce",
                    "enqueue_us": "application-thread time per AllReduce enqueue (ranks share a GPU: "
                                  "time-slicing makes the time per collective jump by whole slices)"}


def check_overhead(samples: dict[str, dict[str, list[float]]], metric: str = "overhead_us",
                   records_with: int | None = None) -> Check:
    """``samples[with|without][size]`` = one median (us) per launch and rank; the launches
    alternate without / with the plugins, so drift between launches hits both sides. A ratio
    counts only when the launches with the plugins produced records (a 1-rank NCCL job emits none)."""
    what = OVERHEAD_METRICS.get(metric, metric)
    if records_with == 0:
        return Check("5 overhead", False, f"{what}: the launches with the plugins emitted no records, so the "
                     "plugin was not exercised and no ratio is meaningful")
    rows, verdicts = {}, []
    for size in sorted(samples.get("with", {}), key=int):
        w, wo = samples["with"][size], samples.get("without", {}).get(size, [])
        if not w or not wo:
            verdicts.append(False)
            continue
        ratio = statistics.median(w) / statistics.median(wo)
        lo, hi = ratio_interval(w, wo)
        rows[size] = {"with_us": round(statistics.median(w), 2), "without_us": round(statistics.median(wo), 2),
                      "ratio": round(ratio, 4), "ratio_90ci": [round(lo, 4), round(hi, 4)],
                      "launch_medians_with": [round(x, 2) for x in w],
                      "launch_medians_without": [round(x, 2) for x in wo]}
        # decided only where the launches' own spread allows it: inside the bound, beyond it, or neither
        verdicts.append(True if hi <= OVERHEAD_MAX else False if lo > OVERHEAD_MAX else None)
    ok = (False if False in verdicts or not rows else None if None in verdicts else True)
    txt = "; ".join(f"{int(s) >> 20} MiB {r['with_us']} vs {r['without_us']} us = {r['ratio']}x "
                    f"(90 % interval {r['ratio_90ci'][0]}-{r['ratio_90ci'][1]})" for s, r in rows.items())
    noisy = " inconclusive: the launches' spread puts the bound inside the interval (one rank per GPU measures " \
            "the time per collective itself);" if ok is None else ""
    return Check("5 overhead", ok, f"median {what}, with/without the plugins, interleaved launches: "
                 f"{txt or 'not measured'} (pass: interval <= {OVERHEAD_MAX}x;{noisy} {records_with} records "
                 "emitted with the plugins)", dict(rows, metric=metric),
                 [f"{int(s) >> 20} MiB launch medians with {r['launch_medians_with']}, without "
                  f"{r['launch_medians_without']}" for s, r in rows.items()])


def ratio_interval(w: list[float], wo: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """90 % bootstrap interval of median(w) / median(wo), resampling each side's launch medians.

    >>> ratio_interval([2.0], [1.0])
    (2.0, 2.0)
    """
    rng = np.random.default_rng(seed)
    a, b = np.asarray(w, float), np.asarray(wo, float)
    r = (np.median(rng.choice(a, (n, len(a))), axis=1) / np.median(rng.choice(b, (n, len(b))), axis=1))
    return float(np.quantile(r, 0.05)), float(np.quantile(r, 0.95))


def check_after_self_send(results: list[dict], events: np.ndarray) -> Check:
    """AllReduce calls issued after an all-to-all (which sends to self): each record either carries a GPU
    time within tolerance of the CUDA events, or is flagged TIMING_SUSPECT (the plugin refused a time
    that broke its channel's kernel order). A GPU time that is wrong and unflagged fails."""
    calls = [cr for res in results for cr in match_calls(res, events, ("after_a2a",)) if cr.complete]
    if not calls:
        return Check("2b timing after send-to-self", False, "no records of the calls after the all-to-all")
    flagged = [cr for cr in calls if cr.suspect]
    timed = [(cr.gpu_us, cr.cuda_us) for cr in calls if not cr.suspect and cr.gpu_us == cr.gpu_us]
    right = sum(1 for g, c in timed if abs(g - c) <= max(TIMING_REL * c, TIMING_ABS_US))
    wrong = len(timed) - right
    med = statistics.median(g / c for g, c in timed if c > 0) if timed else float("nan")
    why = ("NCCL's per-channel profiler counters still match its kernels" if not flagged and not wrong else
           "this NCCL's KernelCh events stopped describing their operations after the send/recv to self")
    owners = owner_offsets(events)
    return Check("2b timing after send-to-self", wrong == 0,
                 f"{len(calls)} AllReduce calls after an all-to-all: {right} GPU-timed within tolerance, "
                 f"{len(flagged)} flagged TIMING_SUSPECT (untimed), {wrong} with a wrong unflagged GPU time"
                 f"{f' (median ratio {med:.2f})' if wrong else ''}; {why}{describe_offsets(owners)}",
                 {"right": right, "flagged": len(flagged), "wrong": wrong, "calls": len(calls), "owners": owners})
