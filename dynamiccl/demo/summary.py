"""The demo's end-of-run summary: what happened and what was detected, what the retuner did and gained (against
NCCL's default and the oracle), whether every rank ran the same config, and where the files are. The numbers
also go to ``summary.json`` in the run directory (what the tests and the matrix measurements read).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from dynamiccl.demo.explain import explain_by_config
from dynamiccl.demo.gain import measure, oracle_regimes

__all__ = ["match", "where", "analyse", "consistency", "print_summary"]


def match(truth: list[dict], changes: list, epoch_s: float, window_s: float = 5.0) -> list[dict]:
    """Pair each truth event with the first detected change within `window_s` after its onset
    (a ``recovery`` truth event with a ``recovery`` change; others with any non-recovery change)."""
    rows, used = [], set()
    for ev in truth:
        want_recovery = ev["kind"] == "recovery" or ev.get("ends")
        hit = next((c for c in changes if id(c) not in used and (c.kind == "recovery") == bool(want_recovery)
                    and ev["t_start"] - 1.0 <= c.detected_s - epoch_s <= ev["t_start"] + window_s), None)
        if hit is not None:
            used.add(id(hit))
        rows.append({**ev, "change": hit})
    return rows


def with_ends(truth: list[dict], duration_s: float) -> list[dict]:
    """The truth plus an ``end`` row for every network event that ends by a duration (not by a ``recovery``
    event): its end is a change back to the baseline that the detector should report too."""
    recoveries = {e["t_start"] for e in truth if e["kind"] == "recovery"}
    out = []
    for e in truth:
        out.append(e)
        if (not e.get("benign") and e["kind"] != "recovery" and e["t_end"] > e["t_start"]
                and e["t_end"] not in recoveries and e["t_end"] < duration_s):
            out.append({**e, "kind": f"{e['kind']} ends", "t_start": e["t_end"], "ends": True})
    return sorted(out, key=lambda e: e["t_start"])


def where(c) -> str:
    parts = []
    if c.ranks:
        parts.append("ranks " + ",".join(map(str, c.ranks[:4])))
    if c.comm_names or c.comms:
        parts.append(",".join(c.comm_names or c.comms)[:40])
    if c.size_buckets:
        parts.append(f"{len(c.size_buckets)} size buckets")
    return "; ".join(parts) or "-"


def consistency(parquet_dir: Path, epoch_s: float) -> dict:
    """From the profiler's records: collective instances on which two ranks ran different configs or config
    versions, and when each applied version first ran."""
    import polars as pl

    files = sorted(str(p) for p in Path(parquet_dir).rglob("*.parquet"))
    if not files:
        return {"instances": 0, "inconsistent": None, "versions": {}}
    lf = pl.scan_parquet(files).filter(pl.col("kind") == 1).select(
        "comm_hash", "func", "seq_number", "algo", "proto", "tuner_config_version", "gpu_start_ns")
    inst = (lf.group_by("comm_hash", "func", "seq_number")
            .agg(pl.struct("algo", "proto").n_unique().alias("cfgs"),
                 pl.col("tuner_config_version").n_unique().alias("versions")).collect())
    firsts = (lf.group_by("tuner_config_version").agg(pl.col("gpu_start_ns").min(), pl.len().alias("records"))
              .sort("tuner_config_version").collect())
    return {"instances": inst.height,
            "inconsistent": int(((inst["cfgs"] > 1) | (inst["versions"] > 1)).sum()),
            "versions": {int(r["tuner_config_version"]): {"first_s": r["gpu_start_ns"] / 1e9 - epoch_s,
                                                          "records": int(r["records"])}
                         for r in firsts.iter_rows(named=True)}}


def _late_alarms(changes: list, truth: list[dict], epoch_s: float) -> dict[str, str]:
    """Changes that are a later alarm on a true change already matched or not: the kind the ground truth's event
    implies, with an onset inside that event (e.g. an 8-byte all-reduce's stream alarming 7 s into a latency
    regime, after the DP all-reduces' streams), and their recoveries. Not false alarms; reported as late."""
    from dynamiccl.harness.retuner_eval.truth import KIND_OF

    out: dict[str, str] = {}
    for c in changes:
        if c.kind == "recovery":
            if c.recovers in out:
                out[c.id] = out[c.recovers]
            continue
        onset = c.start_s - epoch_s
        ev = next((e for e in truth if KIND_OF.get(e["kind"]) == c.kind and e["t_start"] <= onset < e["t_end"]),
                  None)
        if ev is not None:
            out[c.id] = f"{ev['kind']}@{ev['t_start']:.0f}s"
    return out


def _refinements(changes: list, matched_ids: set, why: dict, late: dict) -> set:
    """A ``flapping`` change refines its incident's first report (``evidence["refines"]``): it is the same
    incident, so it is judged with that report. Returns the ids whose report matched a true change; one whose
    report a config explains or that is a late alarm joins ``why`` or ``late`` (updated in place)."""
    right = set()
    for c in changes:
        parent = (getattr(c, "evidence", None) or {}).get("refines")
        if parent in matched_ids:
            right.add(c.id)
        elif parent in why:
            why[c.id] = why[parent]
        elif parent in late:
            late[c.id] = late[parent]
    return right


def _lineage(c) -> dict:
    """An unmatched change's id and the reports it follows (a failure names what to look for in changes.jsonl)."""
    ev = getattr(c, "evidence", None) or {}
    return {"id": c.id, **{k: ev[k] for k in ("refines", "previous") if ev.get(k)}}


def _audit(out: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in (out / "retuner-audit.jsonl").read_text().splitlines() if line]
    except (OSError, ValueError):
        return []


def analyse(args, truth, state, history, out: Path, duration_s: float) -> dict:
    """Everything the summary reports, as plain data (also written to ``summary.json``)."""
    rows = match(with_ends(truth, duration_s), state.changes, state.epoch_s)
    matched = {id(r["change"]) for r in rows if r["change"] is not None}
    matched_ids = {r["change"].id for r in rows if r["change"] is not None}
    # a recovery of a matched change (e.g. a straggler's end) is right too, not an extra change
    extra = [c for c in state.changes
             if id(c) not in matched and not (c.kind == "recovery" and c.recovers in matched_ids)]
    audit = _audit(out)
    # changes the configs the retuner put in force explain (by the ground truth: see .explain), and whether the
    # retuner itself recognised them as its own
    why = explain_by_config(extra, out / "parquet", args.workload, args.scenario, duration_s, state.epoch_s)
    own = {a.get("regime") for a in audit if a.get("action") == "ignore" and a.get("self_induced")}
    late = _late_alarms([c for c in extra if c.id not in why], truth, state.epoch_s)
    right = _refinements(extra, matched_ids, why, late)
    explained = [c for c in extra if c.id in why]
    extra = [c for c in extra if c.id not in why and c.id not in late and c.id not in right]
    regimes = oracle_regimes(args.workload, args.scenario, duration_s, truth)
    gains = [measure(r, history, audit, state.epoch_s) for r in regimes if r["better"]]
    report = {
        "events": [{"kind": r["kind"], "benign": bool(r.get("benign")), "t_start": r["t_start"],
                    "t_end": r["t_end"], "detected_s": (r["change"].detected_s - state.epoch_s) if r["change"] else None,
                    "change_kind": r["change"].kind if r["change"] else None,
                    "where": where(r["change"]) if r["change"] else None} for r in rows],
        "unmatched": [{"kind": c.kind, "detected_s": c.detected_s - state.epoch_s, "magnitude": c.magnitude,
                       "where": where(c), **_lineage(c)} for c in extra],
        "own_config_changes": [{"kind": c.kind, "detected_s": c.detected_s - state.epoch_s,
                                "magnitude": c.magnitude, "where": where(c), **why[c.id],
                                "retuner_saw_own": c.id in own} for c in explained],
        "late_alarms": [{"kind": c.kind, "detected_s": c.detected_s - state.epoch_s, "magnitude": c.magnitude,
                         "where": where(c), "event": late[c.id]} for c in state.changes if c.id in late],
        "no_gain_regimes": sorted({f"{r['kind']}@{r['t_start']:.0f}s" for r in regimes}
                                  - {f"{r['kind']}@{r['t_start']:.0f}s" for r in regimes if r["better"]}),
        "retuner_gains": gains,
        "retuner_actions": dict(Counter(a.get("action") for a in audit)),
        "versions_written": [[t, v] for t, v in state.versions],
        "consistency": consistency(out / "parquet", state.epoch_s),
    }
    # how long each version took from the window that triggered it to the first collective that ran it
    seen = report["consistency"]["versions"]
    report["push_to_records_s"] = [[t, v, seen[v]["first_s"] - t if v in seen else None]
                                   for t, v in state.versions]
    return report


def _s(x, fmt="{:.0f}", none="-"):
    return none if x is None else fmt.format(x)


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.3f} ms"


def print_summary(args, report: dict, result, pipeline, out: Path, pacer=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="What happened, and what was detected")
    for col in ("event", "true onset (s)", "ends (s)", "detected at (s)", "delay (s)", "kind", "where"):
        table.add_column(col)
    for e in report["events"]:
        d = e["detected_s"]
        table.add_row(e["kind"] + (" (benign)" if e["benign"] else ""), _s(e["t_start"]), _s(e["t_end"]), _s(d),
                      _s(None if d is None else d - e["t_start"]), e["change_kind"] or "-", e["where"] or "-")
    console.print(table)
    dropped = dict(pipeline.metrics.dropped)
    paced = (f"; paced to the pipeline: {pacer.waits} steps waited {pacer.waited_s:.1f} s (longest "
             f"{pacer.longest_wait_s:.1f} s), {pacer.timeouts} given up" if pacer is not None and args.fast else "")
    console.print(
        f"simulated {result.sim_seconds:.0f} s in {result.wall_seconds:.0f} s wall; "
        f"records sent by the plugin: {result.totals().get('records_sent', 0):,}; "
        f"aggregated by the collector: {pipeline.metrics.aggregated:,}; "
        f"dropped: {sum(dropped.values()):,} {dict((k, v) for k, v in dropped.items() if v)}{paced}; "
        f"detected changes not matching a true change: {len(report['unmatched'])}"
        + "".join(f"\n  unmatched: {u['kind']} at {u['detected_s']:.0f} s, {u['magnitude']:.2f}x, {u['where']}"
                  for u in report["unmatched"])
        + "".join(f"\n  a late alarm on the true {u['event']}: {u['kind']} at {u['detected_s']:.0f} s, "
                  f"{u['magnitude']:.2f}x, {u['where']}" for u in report["late_alarms"])
        + "".join(f"\n  explained by the retuner's own config {u['config']} (model {u['model_ratio']:.2f}x NCCL's "
                  f"default; the retuner {'ignored it as self-induced' if u['retuner_saw_own'] else 'did not see it as its own'}): "
                  f"{u['kind']} at {u['detected_s']:.0f} s, {u['magnitude']:.2f}x, {u['where']}"
                  for u in report["own_config_changes"]))
    _print_gains(console, args, report)
    c = report["consistency"]
    vs = c["versions"]
    console.print(
        f"retuner: {report['retuner_actions']}; tuner config versions written: {len(report['versions_written'])}; "
        f"in the profiler's records: " + ", ".join(f"v{v} from {x['first_s']:.1f} s" for v, x in vs.items())
        + f"; collective instances on which ranks ran different configs or versions: {c['inconsistent']} of "
          f"{c['instances']:,}")
    lags = [x[2] for x in report["push_to_records_s"] if x[2] is not None]
    if lags:
        console.print(f"a config version reached the job's records {min(lags):.1f}-{max(lags):.1f} s after the window "
                      f"that triggered it ({len(lags)} of {len(report['push_to_records_s'])} versions applied)")
    console.print(f"files: {out / 'parquet'}  {out / 'sim' / 'truth.jsonl'}  {out / 'changes.jsonl'}  "
                  f"{out / 'retuner-audit.jsonl'}  {out / 'tuner.conf'}  {out / 'summary.json'}")


def _print_gains(console, args, report: dict) -> None:
    from rich.table import Table

    rt = Table(title="What the retuner gained where a better config than NCCL's exists (simulator's oracle)"
                     + (" (dry run: recommendations only)" if args.dry_run else ""))
    for col in ("regime", "stream", "NCCL default", "kept (at s)", "measured gain", "oracle", "captured",
                "reverted at (s)"):
        rt.add_column(col)
    for g in report["retuner_gains"]:
        fam, func, bucket = g["stream"]
        rt.add_row(f"{g['kind']} {g['t_start']:.0f}-{g['t_end']:.0f} s", f"{fam} {func} 2^{bucket} B",
                   f"{g['default']} {_ms(g.get('default_measured_s'))}",
                   f"{g['kept'] or 'none'} ({_s(g['kept_at_s'])}) {_ms(g.get('kept_measured_s'))}",
                   _s(g.get("measured_gain"), "{:.2f}x"),
                   f"{g['best']}/{g['best_channels']} {g['best_us'] / 1e3:.3f} ms ({g['oracle_gain']:.2f}x)",
                   _s(g.get("captured"), "{:.0%}"),
                   f"{_s(g['reverted_at_s'])} (regime ended {g['t_end']:.0f})")
    console.print(rt)
    if report["no_gain_regimes"]:
        console.print("regimes where NCCL's default is already the oracle's best (nothing to gain): "
                      + ", ".join(report["no_gain_regimes"]))
