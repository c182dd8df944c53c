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
(what the summary reports). Parts: :mod:`.pacing` (``--fast`` paced to the pipeline's windows),
:mod:`.history` and :mod:`.view` (the live view's per-stream history), :mod:`.gain` and :mod:`.summary`.
"""
from __future__ import annotations

import argparse
import logging
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from dynamiccl.loop import Loop

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
def _free_metrics_address(wanted: str) -> str:
    host, port = wanted.rsplit(":", 1)
    with socket.socket() as s:
        try:
            s.bind((host, int(port)))
            return wanted
        except OSError:
            s.bind((host, 0))
            return f"{host}:{s.getsockname()[1]}"


def _plugin_tuner(conf: Path):
    """The real tuner plugin (a private instance, immediate mode), re-reading ``conf`` at every step boundary.
    In the simulator the engine makes one decision per collective for all ranks, so there is nothing to
    agree on; real jobs use the agreement hook (dynamiccl/nccl_tuner_plugin/README.md)."""
    from dynamiccl.harness.simulator.tuner_abi import PluginTuner, TunerPlugin

    plugin = TunerPlugin.private_copy()
    plugin.configure(str(conf), mode="immediate", poll_ms=0)
    return PluginTuner(plugin, step_hook=lambda t, step: t.plugin.reload())


def run(args: argparse.Namespace) -> int:
    from dynamiccl.collector.config import default_config
    from dynamiccl.collector.pipeline import Pipeline
    from dynamiccl.demo.history import History
    from dynamiccl.demo.pacing import WindowPacer, pacing_lag_s
    from dynamiccl.demo.summary import analyse, print_summary
    from dynamiccl.demo.view import LiveView
    from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
    from dynamiccl.detector.service import Detector
    from dynamiccl.harness.simulator.driver import SimulatedJob
    from dynamiccl.harness.simulator.workload import load as load_workload
    from dynamiccl.retuner.agent import Retuner
    from dynamiccl.retuner.config import PolicyConfig, RetunerConfig

    out = _prepare_out(Path(args.out))
    # torch's one-off costs are paid now, before the job starts: paid by the detector's first window instead, they
    # held that window (and, in real time, every window after it) for 20-43 s on a loaded 2-core machine
    autoencoder = _autoencoder_available(args)
    sock_dir = tempfile.mkdtemp(prefix="dynamiccl-demo-")
    listen = f"unix:{sock_dir}/collector.sock"
    metrics = _free_metrics_address(args.metrics)
    cfg = default_config().replace(receiver={"listen": (listen,)},
                                   parquet={"directory": str(out / "parquet"), "flush_interval_s": 10.0},
                                   prometheus={"address": metrics}, features={"address": None})
    pacer = WindowPacer(lag_s=pacing_lag_s(cfg.window.window_s, cfg.window.allowed_lateness_s),
                        window_s=cfg.window.window_s)
    if args.fast:
        # A paced job is silent while it waits for the pipeline (on a loaded machine, for as long as the pipeline
        # needs); the idle flush must not take that for the end of the job, or it closes a window the job's next
        # step still has records for (dropped as late). The job's end closes every window anyway (shutdown).
        cfg = cfg.replace(window={"idle_flush_s": max(cfg.window.idle_flush_s, 2 * pacer.max_stall_s)})
    pipeline = Pipeline(cfg).start()
    # Room for every window of the run (drops are counted, never silent).
    sub = pipeline.subscribe(max_queue=4096)
    # A 90 s demo cannot afford the production warm-up (60 windows): 20 windows of baseline.
    detector = Detector(DetectorConfig(baseline=BaselineConfig(warmup=args.warmup),
                                       autoencoder=AutoencoderConfig(enabled=autoencoder)))
    topo = load_workload(args.workload).topology.name
    # In --fast mode the job never runs more than `lag` ahead of the windows the detector and retuner have
    # handled (the pacer), so a push reaches the job at most `lag` + one step after the window it answers. In
    # real time the job does not wait: the pipeline's own delay adds to that (a window handled 2-5 s after its
    # end at p90 on a loaded 2-core machine, pushes in the records 3.7-8.1 s after their window), so it gets
    # another `lag`. The retuner gives a push that long to show up in the records before it counts it as not
    # applied, and takes a change that long after its own push for one it may have caused (otherwise its own
    # probe, landing late, opened a "new regime" that aborted the exploration). The demo tunes on detected changes
    # only: no start-up exploration, which would itself move the latencies the detector is learning.
    lag = pacer.lag_s
    grace = lag + 0.5 + (0.0 if args.fast else lag)
    policy = PolicyConfig(tune_at_start=False, apply_grace_s=grace, republish_after_s=grace)
    retuner = Retuner(RetunerConfig(dry_run=args.dry_run, tuner_config_path=str(out / "tuner.conf"),
                                    audit_path=str(out / "retuner-audit.jsonl"), topology=topo, seed=args.seed,
                                    policy=policy))
    tuner = _plugin_tuner(out / "tuner.conf")
    # Real time is paced by the wall clock: a real job does not wait for its monitoring, so neither does this one.
    # Its epoch is aligned to the window, so a given seed gives the same windows in real time as in --fast mode.
    job = SimulatedJob(args.workload, args.scenario, collector=listen, realtime=not args.fast,
                       seed=args.seed, duration_s=args.duration, out_dir=out / "sim", tuner=tuner,
                       gate=pacer if args.fast else None, epoch_align_s=cfg.window.window_s)
    state = _State()
    changes_fh = open(out / "changes.jsonl", "w")
    history = None

    def record(c) -> None:
        state.changes.append(c)
        history.mark_change(c)
        changes_fh.write(c.to_json() + "\n")
        changes_fh.flush()
        log.info("regime change: %s at t=%.0f s (onset %.0f s) magnitude %.2f where %s",
                 c.kind, c.detected_s - state.epoch_s, c.start_s - state.epoch_s, c.magnitude,
                 ",".join(c.comm_names or c.comms)[:60] + (f" ranks {c.ranks[:3]}" if c.ranks else ""))

    loop = Loop(detector, retuner, sinks=[record])

    def handle(wf) -> None:
        state.windows += 1
        if not args.fast:       # real time: how far behind the job's clock the pipeline handles each window
            state.handling_lag_s.append(time.time() - (wf.window_start + wf.window_s))
        history.add(wf)
        t0 = time.perf_counter()
        for v in loop.step(wf).versions:
            state.versions.append((wf.window_start - state.epoch_s, v))
        spent = time.perf_counter() - t0
        if spent > state.slowest_window[0]:
            state.slowest_window = (spent, wf.window_start - state.epoch_s)
        pacer.handled(wf.window_start - state.epoch_s + wf.window_s)

    try:
        job.start()
        state.epoch_s = job.engine.epoch_ns / 1e9
        pacer.set_epoch(state.epoch_s)
        history = History(state.epoch_s)
        truth = job.truth()
        view = LiveView(args, truth, metrics, pipeline, history) if not args.no_live else None
        last_print = time.monotonic()
        latest = None
        with (view.live() if view else _nullcontext()):
            while True:
                finished = not job._thread.is_alive()
                wf = sub.get(timeout=0.25)
                if wf is not None:
                    latest = wf
                    handle(wf)
                if view:
                    view.update(latest, state, retuner, pacer)
                elif time.monotonic() - last_print > 10:
                    last_print = time.monotonic()
                    log.info("windows=%d records=%d changes=%d", state.windows, pipeline.metrics.received,
                             len(state.changes))
                if finished and wf is None:
                    break
        result = job.wait()
    except KeyboardInterrupt:
        pacer.close()
        job.stop()
        result = job.wait()
    finally:
        pacer.close()
        pipeline.shutdown()
        while (wf := sub.get(timeout=0.5)) is not None:     # windows closed during shutdown
            handle(wf)
        changes_fh.close()
        retuner.close()
        tuner.close()
    report = analyse(args, truth, state, history, out, job.engine.duration_s)
    report["pacing"] = {"lag_s": lag, "waits": pacer.waits, "waited_s": pacer.waited_s, "timeouts": pacer.timeouts,
                        "longest_wait_s": pacer.longest_wait_s, "max_step_s": pacer.max_step_s,
                        "promise_s": pacer.promise_s, "load_average": _load_average()}
    report["run"] = {"fast": args.fast, "seed": args.seed, "autoencoder_available": autoencoder,
                     "scenario": args.scenario, "workload": args.workload, "sim_s": result.sim_seconds,
                     "wall_s": result.wall_seconds, "windows": state.windows,
                     "dropped": sum(pipeline.metrics.dropped.values()),
                     "dropped_by_reason": {k: v for k, v in pipeline.metrics.dropped.items() if v},
                     "handling_lag_s": _spread(state.handling_lag_s),
                     "slowest_window": {"wall_s": round(state.slowest_window[0], 3), "t": state.slowest_window[1]}}
    _write_json(out / "summary.json", report)
    print_summary(args, report, result, pipeline, out, pacer)
    return 0


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


def _autoencoder_available(args) -> bool:
    """Whether the detector can run its autoencoder stream (asked for, and torch importable). Also pays torch's
    one-off costs before the job's clock starts: the import (4 s at load 18) and the first training step of a
    model (5.3 s: lazy initialisation of autograd and the optimiser), which the detector's first window paid
    otherwise (the job waited 20-28 s for that window at load 23-25)."""
    if args.no_autoencoder:
        return False
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    from dynamiccl.detector.autoencoder import Autoencoder

    x = {"a": 0.0, "b": 1.0, "c": 2.0}
    warm = Autoencoder(grace_period=1, window_size=8, seed=0)
    warm.score_one(x)
    warm.learn_one(x)
    return True


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


@dataclass
class _State:
    epoch_s: float = 0.0
    windows: int = 0
    changes: list = field(default_factory=list)
    versions: list = field(default_factory=list)     # (t, tuner config version written)
    handling_lag_s: list = field(default_factory=list)   # real time: wall time from a window's end to its handling
    slowest_window: tuple = (0.0, None)                   # (wall s in detector + retuner, window start s)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
