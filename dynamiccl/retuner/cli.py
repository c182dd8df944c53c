"""``dynamiccl retuner``: run the retuner as a service, or evaluate it in the simulator.

    dynamiccl retuner run [--apply] [--topology h100-2x8] [--config retuner.yaml]
    dynamiccl retuner evaluate [--quick|--heldout] [--policy learned|model] [--workload W ...] [--scenario S.yaml ...]
    dynamiccl retuner train [--quick] [--out PATH] [--seed N]

``run`` is recommend-only (dry run) unless ``--apply`` is given. ``evaluate`` ends with one line of
``key=value`` pairs (see dynamiccl/retuner/README.md).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

__all__ = ["register", "run_cmd", "evaluate_cmd"]



def register(subparsers) -> None:
    from dynamiccl.nccl_tuner_plugin.config import DEFAULT_PATH
    from dynamiccl.retuner.config import DEFAULT_AUDIT, DEFAULT_CHANGES, DEFAULT_FEATURES, DEFAULT_METRICS
    p = subparsers.add_parser("retuner", help="retune NCCL from regime changes (service) or evaluate it (simulator)",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="retuner_command", metavar="ACTION")
    r = sub.add_parser("run", help="read regime changes + feature stream, write the tuner config file")
    r.add_argument("--config", metavar="YAML", help="retuner config file (flags override it)")
    r.add_argument("--apply", action="store_true", help="write the tuner config (default: dry run, recommend only)")
    r.add_argument("--topology", help="simulator topology preset or YAML for NCCL's cost model (default: none)")
    r.add_argument("--changes", default=None, help=f"detector regime-change stream (default {DEFAULT_CHANGES})")
    r.add_argument("--features", default=None, help=f"collector feature stream (default {DEFAULT_FEATURES})")
    r.add_argument("--metrics", default=None, help=f"/metrics HOST:PORT (default {DEFAULT_METRICS}); 'off'")
    r.add_argument("--tuner-config", default=None, help=f"tuner config file (default {DEFAULT_PATH})")
    r.add_argument("--audit", default=None, help=f"audit log, JSON lines (default {DEFAULT_AUDIT}); 'off'")
    r.add_argument("--allow", action="append", default=None, metavar="ALGO/PROTO[/CH]", help="allow pattern (repeatable)")
    r.add_argument("--deny", action="append", default=None, metavar="ALGO/PROTO[/CH]", help="deny pattern (repeatable)")
    r.add_argument("--job", action="append", default=None, metavar="PATTERN",
                   help="job_id pattern the retuner may act on (repeatable; required with --apply)")
    r.add_argument("--comm", action="append", default=None, metavar="PATTERN",
                   help="communicator name or 0x-hash pattern (repeatable; default: all of an allowed job)")
    r.add_argument("--allow-unauthenticated", action="store_true",
                   help="with --apply, also act on windows from a collector that does not require tokens")
    r.set_defaults(func=run_cmd)
    e = sub.add_parser("evaluate", help="NCCL default vs tune-once vs oracle vs the retuner, in the simulator")
    e.add_argument("--quick", action="store_true", help="short suite (< 60 s) for tests")
    e.add_argument("--workload", action="append", default=None, help="workload preset or YAML (repeatable)")
    e.add_argument("--scenario", action="append", default=None, help="scenario YAML (repeatable)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--delay", type=float, default=1.0, help="detection delay after onset, s (default 1)")
    e.add_argument("--tuner", choices=("per-rank", "plugin", "python"), default="per-rank",
                   help="how configs are applied: every rank its own real plugin + lossy delivery + agreement "
                        "(default), one plugin instance, or the Python reference")
    e.add_argument("--delivery-faults", type=float, default=0.2, metavar="P",
                   help="per-rank mode: probability that a new version's copy to one random rank is delayed "
                        "(1-4 steps) or lost (30 %% of those) (default 0.2)")
    e.add_argument("--fault-stream", choices=("push", "step"), default="push",
                   help="per-rank mode: draw each push's delivery fault in push order (default) or keyed by the "
                        "step, so two retuner variants meet the same faults at the same steps (A/B runs)")
    e.add_argument("--json", metavar="PATH", help="also write the per-scenario results as JSON")
    e.add_argument("--policy", action="append", default=None, metavar="KEY=VALUE",
                   help="'learned' or 'model' (who ranks the candidates; default model), or KEY=VALUE to override a "
                        "PolicyConfig field of the retuner under test, e.g. recognize=false (repeatable; for ablations)")
    from dynamiccl.progress import add_progress_flag
    add_progress_flag(e)
    e.add_argument("--heldout", action="store_true",
                   help="the learned policy's held-out families (retuner/learned/heldout/) instead of the suite")
    e.set_defaults(func=evaluate_cmd)
    from dynamiccl.retuner.learned.cli import add_train_parser
    add_train_parser(sub)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def config_from_args(args: argparse.Namespace):
    from dynamiccl.retuner.config import RetunerConfig, load_yaml
    cfg = load_yaml(args.config) if args.config else RetunerConfig()
    off = lambda v: None if v is not None and v.lower() in ("off", "none", "") else v  # noqa: E731
    kw = {}
    if args.apply:
        kw["dry_run"] = False
    for flag, key in (("topology", "topology"), ("changes", "changes"), ("features", "features"),
                      ("metrics", "metrics"), ("tuner_config", "tuner_config_path"), ("audit", "audit_path")):
        v = getattr(args, flag)
        if v is not None:
            kw[key] = off(v) if key != "tuner_config_path" else v
    if args.allow is not None:
        kw["allow"] = tuple(args.allow)
    if args.deny is not None:
        kw["deny"] = tuple(args.deny)
    if getattr(args, "job", None):
        kw["jobs"] = tuple(args.job)
    if getattr(args, "comm", None):
        kw["comms"] = tuple(args.comm)
    if getattr(args, "allow_unauthenticated", False):
        kw["allow_unauthenticated"] = True
    return cfg.replace(**kw).validate()


def run_cmd(args: argparse.Namespace) -> int:
    from dynamiccl.contracts.lifecycle import ServiceRun, run_service
    from dynamiccl.retuner.service import RetunerService
    cfg = config_from_args(args)              # ValueError -> "dynamiccl retuner: error: ..." exit 2

    def ready(svc) -> str:
        return (f"retuner ready: dry_run={cfg.dry_run} changes={cfg.changes or '-'} features={cfg.features or '-'} "
                f"metrics={svc.metrics_address or '-'} tuner_config={cfg.tuner_config_path} "
                f"audit={cfg.audit_path or '-'}")

    def stopped(svc) -> str:
        m = svc.retuner.metrics
        return (f"changes={m.counters['changes']} windows={m.counters['windows']} pushes={m.counters['pushes']} "
                f"rollbacks={m.counters['rollbacks']} dropped={sum(m.dropped.values())} version={m.version}")

    return run_service(ServiceRun("retuner", lambda: RetunerService(cfg).start(), ready=ready,
                                  stop=lambda svc: svc.stop(), stopped=stopped,
                                  start_errors=(((ValueError,), 2), ((OSError,), 1))))


def _fmt(x, nd=3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def evaluate_cmd(args: argparse.Namespace) -> int:
    from dynamiccl.harness.retuner_eval.suite import QUICK, SCENARIOS, WORKLOADS, evaluate_one, summarize, summary_line
    from dynamiccl.progress import enabled_for, progress

    wls = args.workload or list(WORKLOADS)
    scs = args.scenario or list(QUICK if args.quick else SCENARIOS)
    if getattr(args, "heldout", False):
        from dynamiccl.retuner.learned.families import heldout
        wls, scs = args.workload or list(heldout()["workloads"]), args.scenario or list(heldout()["scenarios"])
    try:
        rcfg = _policy_config(args)
    except ValueError as e:
        print(f"error: --policy{e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    results = []
    print(f"{'workload':18s} {'scenario':24s} {'oracle gain':>11s} {'captured':>8s} {'react.':>6s} {'ours/default':>12s} "
          f"{'ours/tune-once':>14s} {'mism.':>5s}  collectives to 5 % (first; recurrence; recovery)", flush=True)
    with progress(len(wls) * len(scs), "retuner evaluate", enabled=enabled_for(args)) as step:
        for w, s in ((w, s) for w in wls for s in scs):
            r = evaluate_one(w, s, seed=args.seed, delay_s=args.delay, tuner_mode=args.tuner,
                             delivery_faults=args.delivery_faults, fault_stream=args.fault_stream,
                             retuner_cfg=rcfg)
            results.append(r)
            _print_row(r)
            step()
    s = summarize(results)
    ours = [r.runs["ours"] for r in results]
    kinds = sorted({o.tuner_kind for o in ours})
    mism = _print_consistency(ours, kinds)
    _print_summary(s, kinds, args.delay, time.perf_counter() - t0)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"summary": s, "results": [_jsonable(r) for r in results]}, fh, indent=1, default=str)
    print(summary_line(s, mism), flush=True)
    return 0


def _policy_config(args):
    """``--policy KEY=VALUE`` overrides of `PolicyConfig` (``--policy learned|model`` names who ranks the
    candidates: ``ranker``); None without any. A ValueError's text completes "error: --policy"."""
    args.policy = [f"ranker={p}" if p in ("learned", "model") else p for p in (args.policy or [])]
    if not args.policy:
        return None
    import dataclasses

    import yaml

    from dynamiccl.retuner.config import PolicyConfig, RetunerConfig
    over = {}
    for kv in args.policy:
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            raise ValueError(f" {kv!r}: expected KEY=VALUE")
        over[k.strip()] = yaml.safe_load(v)
    bad = sorted(set(over) - {f.name for f in dataclasses.fields(PolicyConfig)})
    if bad:
        raise ValueError(f": unknown PolicyConfig field(s) {bad}")
    try:
        return RetunerConfig().replace(policy=over).validate()
    except (TypeError, ValueError) as e:
        raise ValueError(f": {e}") from None


def _print_row(r) -> None:
    conv = list(r.convergence)
    first = [_fmt(c.collectives, 0) for c in conv if c.kind != "recovery" and not c.recurrence]
    rec = [_fmt(c.collectives, 0) for c in conv if c.kind != "recovery" and c.recurrence]
    recov = [_fmt(c.collectives, 0) for c in conv if c.kind == "recovery"]
    o = r.runs["ours"]
    print(f"{r.workload:18s} {r.scenario:24s} {r.oracle_gain * 100:10.1f}% {_fmt(r.captured):>8s} "
          f"{_fmt(r.reactive_bound):>6s} "
          f"{r.coll('ours') / r.coll('default'):12.4f} {r.coll('ours') / r.coll('tune_once'):14.4f} "
          f"{_fmt(o.mismatches):>5s}  {','.join(first) or '-'}; {','.join(rec) or '-'}; "
          f"{','.join(recov) or '-'}", flush=True)


def _print_consistency(ours: list, kinds: list) -> str:
    """Per-rank plugins: mismatched collectives, decisions, switches and delivery faults. Returns the
    mismatch count for the last line ("na" when not measured)."""
    if not all(o.mismatches is not None for o in ours):
        print(f"consistency: not measured (tuner: {', '.join(kinds)}; use --tuner per-rank)")
        return "na"
    mism = str(sum(o.mismatches for o in ours))
    dec = sum(o.decisions for o in ours)
    sw = sum(o.switches for o in ours)
    faults = {k: sum(o.faults.get(k, 0) for o in ours) for k in ("delayed", "dropped")}
    print(f"consistency: {mism} mismatched collectives in {dec} per-communicator decisions asked of every "
          f"rank's own plugin; {sw} config switches; deliveries delayed {faults['delayed']}, "
          f"lost {faults['dropped']}")
    return mism


def _print_summary(s: dict, kinds: list, delay: float, elapsed_s: float) -> None:
    print(f"beats tune-once: {s['beats_tune_once']}/{s['regime_scenarios']} regime scenarios where the regime changes "
          f"the best configuration (tune-once ≥ 1 % from the oracle); {s['beats_tune_once_all']}/"
          f"{s['regime_scenarios_all']} of all regime scenarios; regime scenarios with < 1 % to gain: worst "
          f"ours/default − 1 = {_fmt(s['no_gain_worst_slowdown'], 4)}")
    print(f"captured oracle gain per regime scenario: min {_fmt(s['oracle_gain_captured_min'])}, mean "
          f"{_fmt(s['oracle_gain_captured_mean'])} (reactive reference: min {_fmt(s['reactive_bound_min'])}: the "
          f"oracle's configs switched at each detection, nothing paid to find them -- a bound for acting on detections "
          f"alone); collectives to 5 %: first occurrences median "
          f"{_fmt(s['collectives_to_5pct_median'], 0)} (n={s['n_detections']}), recurrences median "
          f"{_fmt(s['recurrence_collectives_median'], 0)} (n={s['n_recurrences']}), recoveries median "
          f"{_fmt(s['recovery_collectives_median'], 0)}; tuner {', '.join(kinds)}; detections from ground truth "
          f"+ {delay:g} s delay; {elapsed_s:.1f} s")
    print(f"recognised from the measurements (before the detector): {s['recognized']} switches "
          f"({s['recognized_reverts']} to the baseline, {s['recognized_reuses']} to a remembered regime's config), {s['unrecognized']} undone "
          f"(the config put in force measured the old regime)")
    print(f"self-induced filter: {s['self_induced_ignored']} of the ground-truth regime changes ignored as caused by "
          f"our own pushes (every one of them would be a false positive here)")


def _jsonable(r) -> dict:
    return {"workload": r.workload, "scenario": r.scenario, "stationary": r.stationary,
            "collective_s": {p: x.coll_s for p, x in r.runs.items()}, "oracle_gain": r.oracle_gain,
            "captured": r.captured, "reactive_bound": r.reactive_bound, "beats_tune_once": r.beats_tune_once,
            "mismatches": r.runs["ours"].mismatches, "pushes": r.runs["ours"].pushes,
            "convergence": [c.__dict__ for c in r.convergence],
            "decisions": [a for a in r.runs["ours"].audit if a.get("action") not in ("push",)]}
