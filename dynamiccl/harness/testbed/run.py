"""One test-bed run: namespaces, ranks, collector, detector, controller; scored at the end.

::

    Topology (netns + veth + bridge, tbf)      this process
    ┌ dtbXXXX-r0 … -r{n-1}: dynamiccl.harness.testbed.worker ──unix socket──▶ collector Pipeline (0.5 s windows)
    │                       dynamiccl.harness.testbed.traffic sink                 │ subscribe()
    └ dtbXXXX-r{n}: dynamiccl.harness.testbed.traffic serve (batches) + bulk      ▼
                                                          dynamiccl.detector.service.Detector ─▶ score
    Controller thread: tc tbf changes / bulk flows at the scenario's times → truth.json

Whatever ends the run — normal end, an exception, SIGINT / SIGTERM / SIGHUP, interpreter exit —
the processes are stopped and the namespaces and links removed (:meth:`Run.close`, idempotent,
also registered with ``atexit``). A SIGKILLed run leaves a state file; ``dynamiccl testbed
cleanup`` removes what it owned.
"""
from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dynamiccl.harness.testbed.controller import BulkClient, Controller, TruthEvent, write_json_atomic
from dynamiccl.harness.testbed.netns import Topology, check_available
from dynamiccl.harness.testbed.scenario import Scenario
from dynamiccl.harness.testbed.score import Detection, Score, score
from dynamiccl.loop import Loop

__all__ = ["Run", "RunResult", "Interrupted", "run_scenario"]

ROOT = Path(__file__).resolve().parents[3]
MASTER_PORT = 29500
DATA_PORT = 5100
SINK_PORT = 5200


class Interrupted(Exception):
    """A signal asked the run to stop."""


@dataclass
class RunResult:
    score: Score
    out_dir: Path
    prefix: str
    windows: int
    records: int
    worker_lines: list[str]
    interrupted: bool = False


class Run:
    """Owns everything a run creates. ``start()`` → ``loop()`` → ``finish()``; ``close()`` always."""

    def __init__(self, scenario: Scenario, *, out_dir: Path | None = None, live: bool = True,
                 print_fn: Callable[[str], None] = print, startup_timeout_s: float = 120.0,
                 detector_overrides: dict | None = None, nice: int = -20, prefix: str | None = None):
        self.scenario = scenario.validate()
        self.live = live
        self.print = print_fn
        self.startup_timeout_s = startup_timeout_s
        self.detector_overrides = detector_overrides or {}
        self.nice = int(nice)  # priority of the test bed's processes (a dedicated node's, roughly)
        self.topology = Topology(scenario.nranks + 1, base_mbit=scenario.base_mbit, latency_ms=scenario.queue_ms,
                                 prefix=prefix)
        self.prefix = self.topology.prefix
        self.out_dir = Path(out_dir or ROOT / "runs" / "testbed" / self.prefix)
        self.sock_dir = tempfile.mkdtemp(prefix=f"{self.prefix}-")
        self.collector_addr = f"unix:{self.sock_dir}/collector.sock"
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: list = []
        self.pipeline = None
        self.sub = None
        self.detector = None
        self.detect_loop: Loop | None = None
        self.controller: Controller | None = None
        self.bulk: BulkClient | None = None
        self.detections: list[Detection] = []
        self.windows = 0
        self._closed = False
        self._lock = threading.Lock()
        self._t0: float | None = None
        self._last_status = 0.0
        self._latest = None
        self._saved: list = []
        # event time from which windows go to the detector: a `detector: defaults` run gives it
        # every window, as `dynamiccl replay` of its records does (a sparse job pools pairs of
        # instances: one start-up window left out shifted every pair, and live and replay
        # reported one slowdown 4 steps apart); else from the scenario's settle time (start())
        self.detect_from = -math.inf if scenario.detector == "defaults" else math.inf
        self.detect_until = float("inf")  # ... and up to which (the scenario's end: not the shutdown)
        atexit.register(self.close)

    # -- set-up ----------------------------------------------------------------------------------
    def start(self) -> "Run":
        from dynamiccl.collector.config import default_config
        from dynamiccl.collector.pipeline import Pipeline
        from dynamiccl.harness.testbed.detect import LiveDetector

        s, topo = self.scenario, self.topology
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "logs").mkdir(exist_ok=True)
        topo.create()
        data = s.nranks
        topo.set_rate([data], s.data_mbit)
        self.print(f"test bed {self.prefix}: {s.nranks} ranks + data node, links {s.base_mbit:g} Mbit/s "
                   f"(tbf), out {self.out_dir}")
        cfg = default_config().replace(
            receiver={"listen": (self.collector_addr,)}, parquet={"directory": str(self.out_dir / "records")},
            prometheus={"address": None}, features={"address": None},
            window={"window_s": s.window_s, "allowed_lateness_s": s.lateness_s, "idle_flush_s": 1.0})
        self.pipeline = Pipeline(cfg).start()
        self.sub = self.pipeline.subscribe(max_queue=256)
        self.detector = LiveDetector(s.window_s, defaults=s.detector == "defaults", **self.detector_overrides)
        self.detect_loop = Loop(self.detector)
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        py = sys.executable
        data_ip = topo.node_ip(data)
        self._spawn("data", topo.netns_exec(data, [py, "-m", "dynamiccl.harness.testbed.traffic", "serve",
                                                   "--bind", f"{data_ip}:{DATA_PORT}"]), env, ready=True)
        self._spawn("bulk", topo.netns_exec(data, [py, "-m", "dynamiccl.harness.testbed.traffic", "bulk"]), env, stdin=True)
        self.bulk = BulkClient(self.procs["bulk"])
        for r in range(s.nranks):
            ip = topo.node_ip(r)
            self._spawn(f"sink{r}", topo.netns_exec(r, [py, "-m", "dynamiccl.harness.testbed.traffic", "sink",
                                                        "--bind", f"{ip}:{SINK_PORT}"]), env, ready=True)
        for r in range(s.nranks):
            argv = [py, "-m", "dynamiccl.harness.testbed.worker", "--rank", str(r), "--world", str(s.nranks),
                    "--master", f"{topo.node_ip(0)}:{MASTER_PORT}", "--collector", self.collector_addr,
                    "--job-id", f"testbed-{self.prefix}", "--buckets", s.buckets,
                    "--compute-ms", str(s.compute_ms), "--data", f"{data_ip}:{DATA_PORT}",
                    "--batch-bytes", str(s.batch_bytes), "--flush-ms", str(s.flush_ms)]
            if s.mlock:
                argv.append("--mlock")
            self._spawn(f"rank{r}", topo.netns_exec(r, argv), env)
        self._wait_for_ranks()
        # the detector learns its baseline from steady state, not from the start-up transient
        if s.detector != "defaults":
            self.detect_from = time.time() + s.settle_s
        self._t0 = time.time() + s.warmup_s
        # the job's shutdown (the stop flag, ranks exiting, the last records flushed) slows its
        # last steps 3-8x: windows ending after the scenario are saved but not detected
        self.detect_until = self._t0 + s.duration_s - s.warmup_s
        self.controller = Controller(s, topo, truth_path=self.out_dir / "truth.json", bulk=self.bulk,
                                     bulk_target=lambda r: f"{topo.node_ip(r)}:{SINK_PORT}",
                                     on_event=self._on_truth)
        self.controller.start(self._t0)
        self._drops_at_start = self.topology.qdisc_drops()
        self.print(f"all {s.nranks} ranks streaming; warm-up {s.warmup_s:g} s, then "
                   f"{len(s.actions)} changes over {s.duration_s - s.warmup_s:g} s")
        return self

    def _spawn(self, name: str, argv: list[str], env: dict, *, ready: bool = False, stdin: bool = False):
        log = open(self.out_dir / "logs" / f"{name}.log", "w")
        self.logs.append(log)
        text_pipe = subprocess.PIPE if (ready or stdin) else log
        nice = self.nice
        p = subprocess.Popen(argv, cwd=str(ROOT), env=env, stdout=text_pipe, stderr=log,
                             stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, text=True,
                             start_new_session=True, preexec_fn=(lambda: os.nice(nice)) if nice else None)
        self.procs[name] = p
        if ready:
            line = p.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"{name} did not start (see {log.name})")

    def _wait_for_ranks(self) -> None:
        n = self.scenario.nranks
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} during start-up "
                                       f"(log: {self.out_dir / 'logs' / (name + '.log')})")
            wf = self.sub.get(timeout=0.5)
            if wf is None:
                continue
            self._process(wf)
            if wf.ranks.height and wf.ranks.filter(wf.ranks["records"] > 0)["rank"].n_unique() >= n:
                return
        raise RuntimeError(f"the ranks did not all stream within {self.startup_timeout_s:g} s")

    # -- live ------------------------------------------------------------------------------------
    def _on_truth(self, ev: TruthEvent) -> None:
        self.print(f"[{ev.onset_wall - self._t0:7.2f}s] change {ev.index}: {ev.description}")

    def _process(self, wf) -> None:
        self.windows += 1
        self._latest = wf
        if len(self._saved) < 100_000:  # the windows, for offline analysis (windows_*.parquet)
            self._saved.append((wf, time.time()))
        if wf.window_start < self.detect_from or wf.window_start + wf.window_s > self.detect_until:
            return
        for d in self.detect_loop.step(wf).changes:
            self.detections.append(d)
            if self._t0 is not None:
                where = f" ranks={d.ranks}" if d.ranks else ""
                rec = f" recovers {d.recovers}" if d.recovers else ""
                self.print(f"[{d.wall_s - self._t0:7.2f}s]   detected {d.id}: {d.kind}{where} "
                           f"x{d.magnitude:.2f}{rec}")

    def _status(self) -> None:
        wf = self._latest
        if wf is None or not self.live:
            return
        now = time.time()
        if now - self._last_status < 5.0:
            return
        self._last_status = now
        k = wf.keys.sort("size_bucket")
        lat = " ".join(f"2^{b}B:{p * 1e3:.0f}ms" for b, p in zip(k["size_bucket"], k["lat_p50_s"]) if p == p)
        rates = " ".join(f"r{i}={r:g}" for i, r in enumerate(self.topology.rates[:self.scenario.nranks]))
        self.print(f"[{now - self._t0:7.2f}s] p50 {lat} | Mbit/s {rates}")

    def loop(self) -> None:
        end = self._t0 + self.scenario.duration_s - self.scenario.warmup_s
        while time.time() < end:
            if self.controller.error is not None:
                raise RuntimeError(f"controller failed: {self.controller.error}")
            for name, p in self.procs.items():
                if name.startswith("rank") and p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} "
                                       f"(log: {self.out_dir / 'logs' / (name + '.log')})")
            wf = self.sub.get(timeout=0.25)
            if wf is not None:
                self._process(wf)
            self._status()

    def finish(self, *, interrupted: bool = False) -> RunResult:
        drops = self.topology.qdisc_drops() if self.topology.created else {}
        worker_lines = self._stop_workers()
        if self.pipeline is not None:
            self.pipeline.shutdown()
            while (wf := self.sub.get(timeout=0.1)) is not None:
                self._process(wf)
        events = self.controller.events if self.controller else []
        sc = score(events, self.detections)
        m = self.pipeline.metrics.snapshot() if self.pipeline else {}
        summary = {"prefix": self.prefix, "scenario": self.scenario.name, "interrupted": interrupted,
                   "score": sc.as_dict(), "line": sc.line(), "windows": self.windows,
                   "detect_from": self.detect_from, "detect_until": self.detect_until,
                   "qdisc_drops": {"before_first_change": getattr(self, "_drops_at_start", {}), "end": drops},
                   "collector": {k: v for k, v in m.items() if isinstance(v, (int, float))},
                   "collector_dropped": dict(m.get("records_dropped_total") or {}),  # reason → records
                   "detector_config": self.detector.config.flat()
                   if self.detector else {},
                   "workers": worker_lines}
        write_json_atomic(self.out_dir / "summary.json", summary)
        self._save_windows()
        with open(self.out_dir / "detections.ndjson", "w") as f:
            for wall, rc in (self.detector.changes if self.detector else []):
                f.write(json.dumps({"wall_s": wall, **json.loads(rc.to_json())}) + "\n")
        return RunResult(sc, self.out_dir, self.prefix, self.windows,
                         int(m.get("records_decoded_total", 0)), worker_lines, interrupted)

    def _save_windows(self) -> None:
        """keys, ranks and waits frames of every window (waits: where there are any), with window_start, as
        parquet files ``windows_{part}.parquet``."""
        import polars as pl
        for part in ("keys", "ranks", "waits"):
            frames = [getattr(wf, part).with_columns(pl.lit(wf.window_start).alias("window_start"),
                                                     pl.lit(wf.window_s).alias("window_s"),
                                                     pl.lit(received).alias("received_wall_s"))
                      for wf, received in self._saved
                      if getattr(wf, part, None) is not None and getattr(wf, part).height]
            if frames:
                pl.concat(frames, how="vertical_relaxed").write_parquet(self.out_dir / f"windows_{part}.parquet")

    def _stop_workers(self) -> list[str]:
        lines = []
        r0 = self.procs.get("rank0")
        if r0 is not None and r0.poll() is None:
            r0.send_signal(signal.SIGTERM)  # rank 0 raises the stop flag: everyone ends the step
        deadline = time.monotonic() + 20
        for r in range(self.scenario.nranks):
            p = self.procs.get(f"rank{r}")
            if p is None:
                continue
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(p)
            try:
                with open(self.out_dir / "logs" / f"rank{r}.log") as f:
                    lines += [ln.strip() for ln in f if ln.startswith(f"rank {r}:")]
            except OSError:
                pass
        return lines

    # -- teardown --------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.controller is not None:
            self.controller.stop()
        if self.bulk is not None:
            try:
                self.bulk.proc.stdin.write("quit\n")
                self.bulk.proc.stdin.flush()
            except (OSError, ValueError):
                pass
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 3
        for p in self.procs.values():
            try:
                p.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(p)
        self.topology.destroy()
        if self.pipeline is not None:
            try:
                self.pipeline.shutdown(timeout=5)
            except Exception:  # pragma: no cover
                pass
        for f in self.logs:
            f.close()
        shutil.rmtree(self.sock_dir, ignore_errors=True)
        try:
            atexit.unregister(self.close)
        except Exception:  # pragma: no cover
            pass


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        p.wait(2)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def run_scenario(scenario: Scenario, **kwargs) -> RunResult:
    """Check prerequisites, run, score; signals end the run early (scored so far) and clean up."""
    check_available()
    run = Run(scenario, **kwargs)
    previous = {}

    def _raise(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    main = threading.current_thread() is threading.main_thread()
    if main:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _raise)
    try:
        try:
            run.start()
            run.loop()
            return run.finish()
        except Interrupted as exc:
            run.print(f"interrupted by {exc}; cleaning up")
            for sig in previous:  # a second signal must not interrupt the clean-up
                signal.signal(sig, signal.SIG_IGN)
            return run.finish(interrupted=True) if run.controller is not None else _empty(run)
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        run.close()
        for sig, h in previous.items():
            signal.signal(sig, h)


def _empty(run: Run) -> RunResult:
    return RunResult(score([], []), run.out_dir, run.prefix, run.windows, 0, [], True)
