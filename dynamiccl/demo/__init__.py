"""`dynamiccl demo`: a simulated training job through the real plugins and the whole pipeline, live.

It starts the collector in process (plugin socket, ``/metrics``, parquet history), the detector
(`dynamiccl.detector.service.Detector`) on the collector's feature stream, and the retuner
(`retuner.Retuner`), which writes the tuner config file that the REAL tuner plugin reads. The
simulated job (``simulator``) asks that plugin for every collective's algorithm/protocol/channels
through its ABI, and its node processes report every collective through the REAL profiler plugin.
A live terminal view shows per-stream latency and bus bandwidth history with detected changes and config switches
marked; the summary says what happened, what was detected when, what was retuned and what it gained against NCCL's
default and the simulator's oracle.

Files in ``--out``: ``parquet/`` (history), ``sim/truth.jsonl`` (ground truth), ``changes.jsonl``
(detected regime changes), ``retuner-audit.jsonl`` (every retuner decision), ``tuner.conf``, ``summary.json``
(what the summary reports). Parts: :mod:`.session` (the stack built and driven), :mod:`.pacing` (``--fast`` paced to the pipeline's windows),
:mod:`.history` and :mod:`.view` (the live view's per-stream history), :mod:`.gain` and :mod:`.summary`.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from dynamiccl.demo.session import _autoencoder_available, _free_metrics_address, _plugin_tuner  # noqa: F401

log = logging.getLogger("dynamiccl.demo")

DEFAULT_METRICS = "127.0.0.1:9464"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a simulated job through the real plugins, live")
    p.add_argument("--scenario", default="demo", help="scenario preset or YAML path (default: demo, ~110 s)")
    p.add_argument("--workload", default="llama7b-tp8-dp2", help="workload preset or YAML path")
    p.add_argument("--duration", type=float, default=None, help="simulated seconds (default: the scenario's)")
    p.add_argument("--fast", action="store_true", help="run as fast as the pipeline keeps up (paced to its windows) instead of in real time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/demo", help="output directory (parquet history, truth, summary)")
    p.add_argument("--metrics", default=DEFAULT_METRICS,
                   help="HOST:PORT for /metrics (a free port is used if this one is taken)")
    p.add_argument("--no-live", action="store_true", help="plain log lines instead of the live view")
    p.add_argument("--warmup", type=int, default=20,
                   help="detector baseline windows (default 20 for the demo; the service default is 60)")
    p.add_argument("--no-autoencoder", action="store_true", help="CUSUM streams only (no torch autoencoder)")
    p.add_argument("--dry-run", action="store_true",
                   help="retuner recommends only (the service default); the demo applies by default")
    p.set_defaults(func=run)


# ------------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    from dynamiccl.demo.session import DemoRun, build
    from dynamiccl.demo.summary import print_summary

    out = _prepare_out(Path(args.out))
    parts = build(args, out)
    demo = DemoRun(args, parts, out)
    result = demo.drive()
    report = _report(args, demo, out, result)
    _write_json(out / "summary.json", report)
    print_summary(args, report, result, parts.pipeline, out, parts.pacer)
    return 0


def _report(args, demo, out: Path, result) -> dict:
    """What the summary reports (and ``summary.json`` holds): the analysis, the pacing, the run."""
    from dynamiccl.demo.summary import analyse

    p, state, pacer = demo.parts, demo.state, demo.parts.pacer
    report = analyse(args, demo.truth, state, demo.history, out, p.job.engine.duration_s)
    report["pacing"] = {"lag_s": p.lag, "waits": pacer.waits, "waited_s": pacer.waited_s, "timeouts": pacer.timeouts,
                        "longest_wait_s": pacer.longest_wait_s, "max_step_s": pacer.max_step_s,
                        "promise_s": pacer.promise_s, "load_average": _load_average()}
    report["run"] = {"fast": args.fast, "seed": args.seed, "autoencoder_available": p.autoencoder,
                     "scenario": args.scenario, "workload": args.workload, "sim_s": result.sim_seconds,
                     "wall_s": result.wall_seconds, "windows": state.windows,
                     "dropped": sum(p.pipeline.metrics.dropped.values()),
                     "dropped_by_reason": {k: v for k, v in p.pipeline.metrics.dropped.items() if v},
                     "handling_lag_s": _spread(state.handling_lag_s),
                     "slowest_window": {"wall_s": round(state.slowest_window[0], 3), "t": state.slowest_window[1]}}
    return report


def _spread(xs: list[float]) -> dict | None:
    """Median, 90th percentile and maximum of ``xs`` (None when empty)."""
    if not xs:
        return None
    q = sorted(xs)
    return {"p50": round(q[len(q) // 2], 3), "p90": round(q[int(0.9 * (len(q) - 1))], 3), "max": round(q[-1], 3),
            "n": len(q)}


def _load_average() -> list[float] | None:
    """The host's 1/5/15-minute load averages at the end of the run (wall times depend on them)."""
    import os

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _prepare_out(out: Path) -> Path:
    """Clear what a previous demo run left in ``out``: its parquet history would otherwise be read together with
    this run's (same job id, and in --fast mode the same epoch: every record twice). A ``parquet/`` that no demo
    wrote (no ``sim/truth.jsonl`` beside it) is not touched: that is an error naming the directory."""
    import shutil

    parquet = out / "parquet"
    if parquet.exists() and not (out / "sim" / "truth.jsonl").is_file():
        raise ValueError(f"{parquet} exists and was not written by a demo run (no {out / 'sim' / 'truth.jsonl'}); "
                         "choose another --out")
    shutil.rmtree(parquet, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("changes.jsonl", "retuner-audit.jsonl", "tuner.conf", "summary.json", "sim/truth.jsonl",
                 "sim/run.json"):
        (out / name).unlink(missing_ok=True)
    return out


def _write_json(path: Path, data: dict) -> None:
    import json

    from dynamiccl.contracts.atomic import atomic_write
    atomic_write(path, json.dumps(data, indent=1, default=str), fsync=False)
