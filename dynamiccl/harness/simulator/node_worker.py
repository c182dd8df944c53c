"""One simulated node: a worker process that loads the real profiler plugin and replays the engine's records.

:class:`~dynamiccl.harness.simulator.driver.SimulatedJob` starts one per node with
``python -c '…node_worker._worker_main()' FD`` (a socket inherited as ``FD``) and talks to it over that
connection:

* parent → worker: the start-up settings (a dict, once), then ``("go", epoch_ns)``, ``("step", ops, keys,
  version)`` per engine step, and ``("finish",)``;
* worker → parent: ``("ready", pid)`` once the plugin and its communicators are up, or ``("error", message)``;
  ``("done", stats)`` after finalize (the plugin's counters at finalize plus ``replayed``).

A worker never raises to the parent: every start-up failure becomes one ``("error", …)`` message that says
what to build or fix, because the parent only sees the worker's pipe (its traceback goes to stderr).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from dynamiccl.harness.simulator.engine import EMU_OP_DTYPE

__all__ = ["stats_dict"]

_PLUGIN_DIR = Path(__file__).resolve().parents[2] / "nccl_profiler_plugin"


class _StartError(Exception):
    """A start-up failure, reported to the parent as ``("error", message)``."""


def stats_dict(emu: Any) -> dict[str, int]:
    """The plugin's record/event/reconnect counters, read through the emulator ({} when it has none)."""
    from dynamiccl.collector.wire_format import STATS_DTYPE

    rec = emu.stats(STATS_DTYPE)
    if rec is None:
        return {}
    return {k: int(rec[k]) for k in STATS_DTYPE.names if k.startswith(("records_", "events_", "reconnects",
                                                                         "sampled_out"))}


def _worker_main() -> None:
    """Entry point of a node worker: ``python -c '…_worker_main()' FD`` with a socket inherited as FD."""
    import sys
    from multiprocessing.connection import Connection

    conn = Connection(int(sys.argv[1]))
    cfg = conn.recv()
    _worker(conn=conn, **cfg)


def _load_mirror(node: int, tuner: dict) -> Any:
    """The node's instance of the tuner plugin, loaded before the profiler so that the profiler finds it
    (NCCL_TUNER_PLUGIN, dlopen RTLD_NOLOAD) and stamps records with its applied version. It reads the same
    config file as the engine's tuner."""
    try:
        from dynamiccl.harness.simulator.tuner_abi import TunerPlugin

        mirror = TunerPlugin(tuner["lib"])
        mirror.configure(tuner["conf"], mode="agree", poll_ms=0)
        mirror.reload()
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        raise _StartError(f"cannot load the tuner plugin {tuner['lib']} on node {node}: {exc}") from None
    return mirror


def _open_emulator(node: int, plugin: str, emu_lib: str, abi: int, inits: list[tuple],
                   threads: int) -> tuple[Any, list[int]]:
    """The emulator with the profiler plugin loaded and one communicator per ``inits`` entry."""
    try:
        from dynamiccl.nccl_profiler_plugin.emulator import EMU_OP_DTYPE as EMU_DT
        from dynamiccl.nccl_profiler_plugin.emulator import Emulator, EmulatorError
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        raise _StartError(f"cannot import the emulator binding: {exc}") from None
    if EMU_DT != EMU_OP_DTYPE:
        raise _StartError("emu_coll_t layout mismatch between dynamiccl.harness.simulator.engine and "
                          "dynamiccl.nccl_profiler_plugin.emulator")
    # The simulated job's broadcasts take NCCL's timed path (a Coll event, GPU times), as before 2.29;
    # NCCL 2.29+'s default (no event, an API-level record) is the plugin tests'. Set it to 1 to see it.
    os.environ.setdefault("NCCL_ALLGATHERV_ENABLE", "0")
    try:
        emu = Emulator(plugin, abi, lib=emu_lib)
    except OSError as exc:
        raise _StartError(f"cannot load the emulator library {emu_lib}: {exc}; build it with "
                          f"`make -C {_PLUGIN_DIR} emulator`") from None
    except (EmulatorError, AttributeError) as exc:
        raise _StartError(f"cannot open profiler plugin {plugin} (ABI v{abi}): {exc}") from None
    try:
        ids = [emu.comm_init(h, name, nn, nr, rank, threads) for h, name, nn, nr, rank in inits]
    except EmulatorError as exc:
        emu.close()
        raise _StartError(f"plugin init failed on node {node}: {exc}") from None
    return emu, ids


class _Mirror:
    """Applies, before each step, the tuner config version the engine's decisions used for it; counts the
    versions this node could not prepare (``tuner_version_misses``)."""

    def __init__(self, plugin: Any) -> None:
        self.plugin = plugin
        self.misses = 0

    def follow(self, version: int | None) -> None:
        p = self.plugin
        if version is None or version == p.applied_version:
            return
        p.reload()
        if p.prepare_version(version):
            p.apply_version(version)
        else:
            self.misses += 1


def _replay(emu: Any, ids: np.ndarray, ops: np.ndarray, keys: np.ndarray, epoch_ns: int,
            pace_ns: int | None) -> None:
    """Run one step's records through the plugin, one ``emu_run_colls`` per communicator run; with a pace
    (real time) the records are batched by ``pace_ns`` of GPU end time and each batch waits for the wall
    clock to pass its end."""
    if pace_ns is not None:
        bucket = (ops["gpu_end_ns"].astype(np.int64) - epoch_ns) // pace_ns
        order = np.lexsort((keys, bucket))
        ops, keys, bucket = ops[order], keys[order], bucket[order]
        cuts = np.flatnonzero((np.diff(keys) != 0) | (np.diff(bucket) != 0)) + 1
    else:
        bucket = None
        cuts = np.flatnonzero(np.diff(keys) != 0) + 1
    lo = 0
    for hi in [*cuts.tolist(), len(ops)]:
        if bucket is not None:
            due = epoch_ns + (int(bucket[lo]) + 1) * pace_ns
            wait = (due - time.time_ns()) / 1e9
            if wait > 0:
                time.sleep(wait)
        emu.run(int(ids[keys[lo]]), ops[lo:hi])
        lo = hi


def _drain(emu: Any, drain_timeout_s: float) -> None:
    """Let the plugin's sender drain its ring before finalize (whose final flush is time-bounded)."""
    deadline = time.monotonic() + drain_timeout_s
    while time.monotonic() < deadline:
        s = stats_dict(emu)
        done = s.get("records_sent", 0) + s.get("records_undelivered", 0) + s.get("records_dropped_ring_full", 0)
        if not s or done >= s.get("records_emitted", 0):
            break
        time.sleep(0.01)


def _worker(node: int, conn: Any, plugin: str, emu_lib: str, abi: int, inits: list[tuple], realtime: bool,
            pace_ns: int, threads: int, drain_timeout_s: float, tuner: dict | None = None) -> None:
    try:
        mirror = _Mirror(_load_mirror(node, tuner)) if tuner is not None else None
        emu, ids = _open_emulator(node, plugin, emu_lib, abi, inits, threads)
    except _StartError as exc:
        conn.send(("error", str(exc)))
        return
    ids_a = np.array(ids, dtype=np.int64)
    conn.send(("ready", os.getpid()))
    epoch_ns = 0
    replayed = 0
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg[0] == "go":
            epoch_ns = int(msg[1])
        elif msg[0] == "step":
            ops, keys = msg[1], msg[2]
            if mirror is not None:
                mirror.follow(msg[3] if len(msg) > 3 else None)
            _replay(emu, ids_a, ops, keys, epoch_ns, pace_ns if realtime else None)
            replayed += len(ops)
        elif msg[0] == "finish":
            break
    for cid in ids:
        emu.sync(cid)
    _drain(emu, drain_timeout_s)
    for cid in ids:
        emu.comm_finalize(cid)
    stats = stats_dict(emu)
    stats["replayed"] = replayed
    if mirror is not None:
        stats["tuner_version_misses"] = mirror.misses
    emu.close()
    conn.send(("done", stats))
