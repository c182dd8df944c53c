"""One demo run: the stack built (collector pipeline, detector, retuner, the real tuner plugin, the
simulated job) and driven, each window through the one loop (`dynamiccl.loop.Loop`)."""
from __future__ import annotations

import contextlib
import logging
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamiccl.loop import Loop

__all__ = ["Parts", "build", "DemoRun"]

log = logging.getLogger("dynamiccl.demo")


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


@dataclass
class Parts:
    """The running stack of one demo."""
    metrics: str               # the /metrics address in use
    pacer: Any
    pipeline: Any
    sub: Any                   # the pipeline's window subscription
    detector: Any
    retuner: Any
    tuner: Any
    job: Any
    lag: float
    autoencoder: bool


def build(args, out: Path) -> Parts:
    from dynamiccl.collector.config import default_config
    from dynamiccl.collector.pipeline import Pipeline
    from dynamiccl.demo.pacing import WindowPacer, pacing_lag_s
    from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
    from dynamiccl.detector.service import Detector
    from dynamiccl.harness.simulator.driver import SimulatedJob
    from dynamiccl.harness.simulator.workload import load as load_workload
    from dynamiccl.retuner.agent import Retuner
    from dynamiccl.retuner.config import PolicyConfig, RetunerConfig

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
    return Parts(metrics, pacer, pipeline, sub, detector, retuner, tuner, job, lag, autoencoder)


@dataclass
class _State:
    epoch_s: float = 0.0
    windows: int = 0
    changes: list = field(default_factory=list)
    versions: list = field(default_factory=list)     # (t, tuner config version written)
    handling_lag_s: list = field(default_factory=list)   # real time: wall time from a window's end to its handling
    slowest_window: tuple = (0.0, None)                   # (wall s in detector + retuner, window start s)


class DemoRun:
    """The job driven to its end: every window through the loop (detector, retuner), every change
    recorded (``changes.jsonl``, the live view's history), the live view or a log line every 10 s."""

    def __init__(self, args, parts: Parts, out: Path):
        self.args, self.parts = args, parts
        self.state = _State()
        self.history = None
        self.truth = None
        self.changes_fh = open(out / "changes.jsonl", "w")
        self.loop = Loop(parts.detector, parts.retuner, sinks=[self.record])

    def record(self, c) -> None:
        state = self.state
        state.changes.append(c)
        self.history.mark_change(c)
        self.changes_fh.write(c.to_json() + "\n")
        self.changes_fh.flush()
        log.info("regime change: %s at t=%.0f s (onset %.0f s) magnitude %.2f where %s",
                 c.kind, c.detected_s - state.epoch_s, c.start_s - state.epoch_s, c.magnitude,
                 ",".join(c.comm_names or c.comms)[:60] + (f" ranks {c.ranks[:3]}" if c.ranks else ""))

    def handle(self, wf) -> None:
        state = self.state
        state.windows += 1
        if not self.args.fast:       # real time: how far behind the job's clock the pipeline handles each window
            state.handling_lag_s.append(time.time() - (wf.window_start + wf.window_s))
        self.history.add(wf)
        t0 = time.perf_counter()
        for v in self.loop.step(wf).versions:
            state.versions.append((wf.window_start - state.epoch_s, v))
        spent = time.perf_counter() - t0
        if spent > state.slowest_window[0]:
            state.slowest_window = (spent, wf.window_start - state.epoch_s)
        self.parts.pacer.handled(wf.window_start - state.epoch_s + wf.window_s)

    def drive(self):
        """Runs the job to its end (or Ctrl-C); returns its result. Everything is shut down and every
        window closed during the shutdown is handled, whatever happens."""
        from dynamiccl.demo.history import History

        p, state = self.parts, self.state
        try:
            p.job.start()
            state.epoch_s = p.job.engine.epoch_ns / 1e9
            p.pacer.set_epoch(state.epoch_s)
            self.history = History(state.epoch_s)
            self.truth = p.job.truth()
            self._watch()
            result = p.job.wait()
        except KeyboardInterrupt:
            p.pacer.close()
            p.job.stop()
            result = p.job.wait()
        finally:
            p.pacer.close()
            p.pipeline.shutdown()
            while (wf := p.sub.get(timeout=0.5)) is not None:     # windows closed during shutdown
                self.handle(wf)
            self.changes_fh.close()
            p.retuner.close()
            p.tuner.close()
        return result

    def _watch(self) -> None:
        from dynamiccl.demo.view import LiveView

        args, p, state = self.args, self.parts, self.state
        view = LiveView(args, self.truth, p.metrics, p.pipeline, self.history) if not args.no_live else None
        last_print = time.monotonic()
        latest = None
        with (view.live() if view else contextlib.nullcontext()):
            while True:
                finished = not p.job._thread.is_alive()
                wf = p.sub.get(timeout=0.25)
                if wf is not None:
                    latest = wf
                    self.handle(wf)
                if view:
                    view.update(latest, state, p.retuner, p.pacer)
                elif time.monotonic() - last_print > 10:
                    last_print = time.monotonic()
                    log.info("windows=%d records=%d changes=%d", state.windows, p.pipeline.metrics.received,
                             len(state.changes))
                if finished and wf is None:
                    break
