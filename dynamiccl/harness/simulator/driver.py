"""Drive the real profiler plugin with the engine's records: one worker process per simulated node.

Each worker sets ``DYNAMICCL_HOST=sim-node-NN`` (plus ``DYNAMICCL_COLLECTOR``/``DYNAMICCL_JOB_ID``), loads
the plugin through the NCCL call-sequence emulator (``libdccl-nccl-emu.so``, ctypes binding
:class:`dynamiccl.nccl_profiler_plugin.emulator.Emulator`), calls ``emu_comm_init`` once per (communicator, local rank)
of its node and replays the numpy record buffers it receives over a pipe with ``emu_run_colls`` — no Python
work per operation. So every simulated node is one PROCESS (own pid, own plugin sender, own host name), as
on a real cluster. The worker's side is :mod:`~dynamiccl.harness.simulator.node_worker`; the collector
stand-in that tests and ``simulate bench`` use is :class:`~dynamiccl.harness.simulator.wire_sink.WireSink`.

With a :class:`dynamiccl.harness.simulator.engine_tuners.PluginTuner` as ``tuner``, each worker also loads the real tuner plugin
(``NCCL_TUNER_PLUGIN``, before the profiler) reading the same config file, and applies the version the engine's
decisions used for each step, so the profiler stamps ``tuner_config_version`` in the records as in a real job.

Two modes:

* ``realtime=True`` (demo): the GPU clock epoch is the wall clock at start and each worker replays a record
  once the wall clock passes its ``gpu_end_ns`` (in batches of ``pace_s``), so the collector sees a live job.
* ``realtime=False`` (evaluation): as fast as possible; simulated time runs ahead of the wall clock from a
  fixed epoch (:data:`~dynamiccl.harness.simulator.engine.DEFAULT_EPOCH_NS`).

>>> job = SimulatedJob("small", "stationary", collector="unix:/tmp/x.sock", duration_s=0.01)  # doctest: +SKIP
>>> result = job.start().wait(); result.records                                              # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from multiprocessing.connection import Connection
from typing import Any, Callable, Mapping


from dynamiccl.contracts.addresses import COLLECTOR_LISTEN
from dynamiccl.harness.simulator import scenario as scenario_mod
from dynamiccl.harness.simulator import workload as workload_mod
from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.harness.simulator.engine import DEFAULT_EPOCH_NS, Engine, Tuner
from dynamiccl.harness.simulator.scenario import Scenario, write_truth
from dynamiccl.harness.simulator.wire_sink import WireSink  # re-exported: callers import it from here
from dynamiccl.harness.simulator.workload import Workload

__all__ = ["SimulatedJob", "RunResult", "DriverError", "WireSink", "run", "default_plugin_path", "default_emu_lib_path",
           "WORKER_ENV_DEFAULTS"]

log = logging.getLogger(__name__)

#: Plugin settings for simulated workers unless the caller's environment or ``plugin_env`` sets them: a larger
#: ring and a shorter flush so that fast mode (≥ 100k records/s per process) does not overflow the ring.
WORKER_ENV_DEFAULTS = {"DYNAMICCL_RING_SIZE": "262144", "DYNAMICCL_FLUSH_MS": "20"}
_REPO = Path(__file__).resolve().parents[3]
_WORKER_ENTRY = "from dynamiccl.harness.simulator.node_worker import _worker_main; _worker_main()"


class DriverError(RuntimeError):
    """The plugin, the emulator library or a worker failed; the message says what and how to fix it."""


def default_plugin_path() -> Path:
    from dynamiccl import nccl_profiler_plugin
    return nccl_profiler_plugin.library_path()


def default_emu_lib_path() -> Path:
    override = os.environ.get("DYNAMICCL_EMU_LIB")
    if override:
        return Path(override)
    from dynamiccl.nccl_profiler_plugin import emulator

    return emulator.library_path()


@dataclass
class RunResult:
    steps: int = 0
    records: int = 0                     # per-rank operation records replayed through the plugin
    sim_seconds: float = 0.0
    wall_seconds: float = 0.0
    engine_seconds: float = 0.0          # wall time spent in the engine (parent process)
    epoch_ns: int = 0
    out_dir: str | None = None
    truth_path: str | None = None
    plugin_stats: list[dict[str, int]] = field(default_factory=list)   # per node, at finalize
    stopped_early: bool = False

    @property
    def records_per_s(self) -> float:
        return self.records / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def totals(self) -> dict[str, int]:
        keys = set().union(*(s.keys() for s in self.plugin_stats)) if self.plugin_stats else set()
        return {k: sum(int(s.get(k, 0)) for s in self.plugin_stats) for k in sorted(keys)}


def _tuner_plugin(tuner: Any) -> Any:
    """The DynamICCL plugin instance behind an engine tuner (:class:`dynamiccl.harness.simulator.engine_tuners.PluginTuner`), or None."""
    p = getattr(tuner, "plugin", None)
    return p if getattr(p, "has_control", False) else None


def _tuner_mirror_spec(tuner: Any) -> dict | None:
    p = _tuner_plugin(tuner)
    return None if p is None else {"lib": str(p.path), "conf": str(p.config_file)}


def _tuner_version(tuner: Any) -> int | None:
    p = _tuner_plugin(tuner)
    return None if p is None else p.applied_version


# ------------------------------------------------------------------------------------------------
# parent
# ------------------------------------------------------------------------------------------------
class SimulatedJob:
    """A simulated training job feeding the real plugin. ``start()`` returns once every worker has loaded the
    plugin and initialised its communicators (raising :class:`DriverError` otherwise); records then flow in a
    background thread until ``duration_s`` of simulated time, :meth:`stop`, or an error. :meth:`wait` joins.

    ``gate`` (optional) is called before every step but the first with the span (start, end; simulated s) of
    the step last handed to the workers; it may block to hold the job back (``dynamiccl demo`` paces ``--fast``
    runs to its pipeline's windows with it) and must return eventually (the job waits for it, :meth:`stop`
    included).

    ``epoch_align_s`` (real time only) rounds the job's epoch up to a multiple of it, so that a collector's
    windows of that length start at whole simulated multiples of it, as in fast mode (whose epoch is a whole
    second); the workers wait until then.

    ``workload``/``scenario`` take objects, preset names or YAML paths. ``out_dir`` (optional) receives
    ``truth.jsonl`` (ground truth, written at start) and ``run.json`` (written at the end).
    """

    def __init__(self, workload: Workload | str, scenario: Scenario | str | None = None, *,
                 collector: str = COLLECTOR_LISTEN, seed: int = 0, duration_s: float | None = None,
                 realtime: bool = False, out_dir: str | Path | None = None, plugin: str | Path | None = None,
                 emu_lib: str | Path | None = None, abi: int = 6, job_id: str | None = None,
                 epoch_ns: int | None = None, tuner: Tuner | None = None,
                 plugin_env: Mapping[str, str] | None = None, pace_s: float = 0.02, emu_threads: int = 1,
                 drain_timeout_s: float = 10.0, start_timeout_s: float = 60.0,
                 gate: Callable[[float, float], None] | None = None, epoch_align_s: float | None = None) -> None:
        self.workload = workload
        self.scenario = scenario
        self.collector = collector
        self.seed = seed
        self.duration_s = duration_s
        self.realtime = realtime
        self.out_dir = out_dir
        self.plugin = plugin
        self.emu_lib = emu_lib
        self.abi = abi
        self.job_id = job_id
        self.epoch_ns = epoch_ns
        self.tuner = tuner
        self.plugin_env = plugin_env
        self.pace_s = pace_s
        self.emu_threads = emu_threads
        self.drain_timeout_s = drain_timeout_s
        self.start_timeout_s = start_timeout_s
        self.gate = gate
        self.epoch_align_s = epoch_align_s
        self._wl = workload if isinstance(workload, Workload) else workload_mod.load(workload)
        sc = scenario if isinstance(scenario, Scenario) or scenario is None else scenario_mod.load(scenario)
        self._sc = sc if sc is not None else Scenario("stationary")
        self._duration = duration_s if duration_s is not None else (self._sc.duration_s or 60.0)
        self._engine: Engine | None = None
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._result = RunResult()
        self._error: BaseException | None = None
        self._t0 = 0.0

    # ---- lifecycle --------------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("call start() first")
        return self._engine

    def truth(self) -> list[dict[str, Any]]:
        """Ground-truth timeline (absolute ns from the job's epoch); available after :meth:`start`."""
        return self._sc.truth(duration_s=self._duration, epoch_ns=self.engine.epoch_ns)

    def start(self) -> "SimulatedJob":
        plugin = Path(self.plugin) if self.plugin is not None else default_plugin_path()
        emu_lib = Path(self.emu_lib) if self.emu_lib is not None else default_emu_lib_path()
        if not plugin.is_file():
            raise DriverError(f"profiler plugin not found at {plugin}; build it with "
                              f"`make -C {_REPO / 'dynamiccl' / 'nccl_profiler_plugin'} libnccl-profiler-dynamiccl.so`")
        if not emu_lib.is_file():
            raise DriverError(f"emulator library not found at {emu_lib}; build it with "
                              f"`make -C {_REPO / 'dynamiccl' / 'nccl_profiler_plugin'} emulator`")
        # the engine's layout is needed to start the workers; in real time its epoch is fixed once they are ready
        layout = Engine(self._wl, self._sc, seed=self.seed, tuner=self.tuner, duration_s=self._duration)
        job_id = self.job_id or f"sim-{self._wl.name}-{self._sc.name}-s{self.seed}"
        tuner_spec = _tuner_mirror_spec(self.tuner)
        try:
            for node in range(layout.n_nodes):
                self._spawn(node, layout, job_id, plugin, emu_lib, tuner_spec)
            self._await_ready()
            epoch = self._epoch()
            for conn in self._conns:
                conn.send(("go", epoch))
        except EOFError:
            self._kill()
            raise DriverError("a worker exited during start-up (see its stderr)") from None
        except BaseException:
            self._kill()
            raise
        self._engine = Engine(self._wl, self._sc, seed=self.seed, epoch_ns=epoch, tuner=self.tuner,
                              duration_s=self._duration)
        self._result = RunResult(epoch_ns=epoch)
        if self.out_dir is not None:
            out = Path(self.out_dir)
            out.mkdir(parents=True, exist_ok=True)
            self._result.out_dir = str(out)
            self._result.truth_path = str(write_truth(out / "truth.jsonl", self._sc, duration_s=self._duration,
                                                      epoch_ns=epoch))
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._feed, name="sim-feed", daemon=True)
        self._thread.start()
        log.info("simulated job %s: %d nodes, %s, scenario %s, %s mode", job_id, layout.n_nodes,
                 self._wl.name, self._sc.name, "real-time" if self.realtime else "fast")
        return self

    def _worker_env(self, node: int, job_id: str, tuner_spec: dict | None) -> dict[str, str]:
        env = {**os.environ, **{k: v for k, v in WORKER_ENV_DEFAULTS.items() if k not in os.environ}}
        env.update({"DYNAMICCL_COLLECTOR": self.collector, "DYNAMICCL_HOST": f"sim-node-{node:02d}",
                    "DYNAMICCL_JOB_ID": job_id})
        env.update(dict(self.plugin_env or {}))
        if tuner_spec is not None:
            env["NCCL_TUNER_PLUGIN"] = tuner_spec["lib"]
        env["PYTHONPATH"] = os.pathsep.join([str(_REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        return env

    def _spawn(self, node: int, layout: Engine, job_id: str, plugin: Path, emu_lib: Path,
               tuner_spec: dict | None) -> None:
        """Start node ``node``'s worker process (:mod:`~dynamiccl.harness.simulator.node_worker`) and send it
        its settings."""
        inits = [(c.comm_hash, c.name, c.nnodes, c.nranks, c.rank) for c in layout.node_comms(node)]
        a, b = socket.socketpair()
        p = subprocess.Popen([sys.executable, "-c", _WORKER_ENTRY, str(b.fileno())], pass_fds=(b.fileno(),),
                             env=self._worker_env(node, job_id, tuner_spec))
        b.close()
        conn = Connection(a.detach())
        self._procs.append(p)
        self._conns.append(conn)
        conn.send({"node": node, "plugin": str(plugin), "emu_lib": str(emu_lib), "abi": self.abi,
                   "inits": inits, "realtime": self.realtime,
                   "pace_ns": int(self.pace_s * 1e9), "threads": self.emu_threads,
                   "drain_timeout_s": self.drain_timeout_s, "tuner": tuner_spec})

    def _await_ready(self) -> None:
        for node, conn in enumerate(self._conns):
            if not conn.poll(self.start_timeout_s):
                raise DriverError(f"worker for node {node} did not start within {self.start_timeout_s} s")
            msg = conn.recv()
            if msg[0] != "ready":
                raise DriverError(msg[1])

    def _epoch(self) -> int:
        """The job's epoch: given, else the wall clock (real time, rounded up to ``epoch_align_s``) or the
        fixed fast-mode epoch."""
        if self.epoch_ns is not None:
            return self.epoch_ns
        if not self.realtime:
            return DEFAULT_EPOCH_NS
        epoch = time.time_ns()
        if self.epoch_align_s:
            step = int(self.epoch_align_s * 1e9)      # the job starts at the next multiple (at most one away)
            epoch = -(-epoch // step) * step
        return epoch

    def _feed(self) -> None:
        eng, res = self.engine, self._result
        last_start = 0.0
        try:
            while not eng.done and not self._stop.is_set():
                if self.gate is not None and res.steps:   # may hold the job back (the demo paces it)
                    self.gate(last_start, res.sim_seconds)
                t = time.perf_counter()
                b = eng.step()
                last_start = b.t_start_s
                res.engine_seconds += time.perf_counter() - t
                version = _tuner_version(self.tuner)   # the config version this step's decisions used
                for node, conn in enumerate(self._conns):
                    ops, keys = b.node(node)
                    conn.send(("step", ops, keys, version))
                res.steps += 1
                res.records += len(b.ops)
                res.sim_seconds = b.t_end_s
            res.stopped_early = self._stop.is_set() and not eng.done
            for conn in self._conns:
                conn.send(("finish",))
            for node, conn in enumerate(self._conns):
                if not conn.poll(self.drain_timeout_s + 30.0):
                    raise DriverError(f"worker for node {node} did not finish")
                msg = conn.recv()
                res.plugin_stats.append(msg[1])
        except (BrokenPipeError, EOFError, ConnectionResetError) as exc:
            codes = [p.poll() for p in self._procs]
            self._error = DriverError(f"a node worker died (exit codes {codes}): {exc}")
        except BaseException as exc:  # noqa: BLE001 - re-raised in wait()
            self._error = exc
        finally:
            res.wall_seconds = time.monotonic() - self._t0
            for p in self._procs:
                try:
                    p.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    pass
            self._kill()
            if res.out_dir is not None:
                meta = {"workload": self._wl.name, "topology": self._wl.topology.name, "scenario": self._sc.name,
                        "seed": self.seed, "duration_s": self._duration, "realtime": self.realtime,
                        "collector": self.collector, **asdict(res)}
                atomic_write(Path(res.out_dir) / "run.json", json.dumps(meta, indent=1), fsync=False)

    def stop(self) -> None:
        """Stop feeding records; workers finalize (flushing the plugin) and the job ends."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> RunResult:
        if self._thread is None:
            raise RuntimeError("call start() first")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("simulated job still running")
        if self._error is not None:
            raise self._error
        return self._result

    def _kill(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for c in self._conns:
            c.close()
        self._procs, self._conns = [], []

    def __enter__(self) -> "SimulatedJob":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join()


def run(workload: Workload | str, scenario: Scenario | str | None = None, **kwargs: Any) -> RunResult:
    """Blocking: start a :class:`SimulatedJob` and wait for it."""
    return SimulatedJob(workload, scenario, **kwargs).start().wait()
