"""Tuners for the simulator's :class:`~dynamiccl.harness.simulator.engine.Engine` (its ``Tuner`` protocol).

:class:`FileTuner` is the Python reference of what the C plugin does with the retuner's file: at every
step boundary (:meth:`FileTuner.refresh`, the agreement point) it re-reads the file if it changed, keeps its
last good configuration when the file is malformed, and applies the newest version with
:func:`dynamiccl.nccl_tuner_plugin.config.apply_rule` (exact plugin semantics). :class:`RuleTuner` applies a fixed,
in-memory config the same way (baselines and oracle).

:func:`make_file_tuner` returns the real plugin through :mod:`dynamiccl.harness.simulator.tuner_abi` when that binding exists
and works, else :class:`FileTuner`; ``.kind`` says which.
"""
from __future__ import annotations

import logging
import os
import shutil

import numpy as np

from dynamiccl.nccl_tuner_plugin.config import TunerConfig, apply_rule, read_configs

__all__ = ["FileTuner", "RuleTuner", "make_file_tuner", "distribute"]

log = logging.getLogger(__name__)



def distribute(rng, n_ranks: int, step: int, snap, *, p_fault: float, p_drop: float, max_delay: int,
               faults: dict) -> list[tuple]:
    """``(due step, rank, snapshot)`` for every rank's copy of a pushed config: with probability
    ``p_fault`` one random rank's copy is dropped (``p_drop``) or delayed 1..``max_delay`` steps,
    counted in ``faults["dropped"]`` / ``faults["delayed"]`` (a distributor that loses or reorders)."""
    faulty = rng.randrange(n_ranks) if rng.random() < p_fault else None
    out = []
    for r in range(n_ranks):
        if r == faulty:
            if rng.random() < p_drop:
                faults["dropped"] += 1
                continue
            faults["delayed"] += 1
            out.append((step + rng.randint(1, max_delay), r, snap))
        else:
            out.append((step, r, snap))
    return out

class RuleTuner:
    kind = "python-rules"

    def __init__(self, cfg: TunerConfig | None = None) -> None:
        self.cfg = cfg
        self.calls = 0

    @property
    def version(self) -> int:
        return self.cfg.version if self.cfg is not None else 0

    def set(self, cfg: TunerConfig | None) -> None:
        self.cfg = cfg

    def refresh(self) -> int:
        return self.version

    def get_coll_info(self, comm, func: str, nbytes: int, cost_table: np.ndarray):
        self.calls += 1
        table, nch, _chunk = apply_rule(self.cfg, cost_table, func, int(nbytes), comm.comm_hash,
                                        n_nodes=int(getattr(comm, "n_nodes", 1)))
        return table, nch


class FileTuner(RuleTuner):
    """Reloads ``path`` at step boundaries; a malformed file keeps the last good config (counted)."""

    kind = "python-reference"

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(None)
        self.path = os.fspath(path)
        self._stamp: tuple | None = None
        self.reloads = 0
        self.errors = 0
        self.last_error: str | None = None

    def refresh(self) -> int:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self.version
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return self.version
        self._stamp = stamp
        try:
            configs = read_configs(self.path)
        except (ValueError, OSError, UnicodeDecodeError) as e:
            self.errors += 1
            self.last_error = str(e)
            log.warning("tuner config %s unreadable, keeping version %d: %s", self.path, self.version, e)
            return self.version
        self.reloads += 1
        if configs and configs[-1].version >= self.version:
            self.cfg = configs[-1]
        return self.version


FAULT_STREAMS = ("push", "step")


class LossyDelivery:
    """Step hook for :class:`dynamiccl.harness.simulator.engine_tuners.RankTuners`: the retuner's file reaches each rank through a
    lossy distributor, then every rank reloads and the agreement hook (:func:`dynamiccl.nccl_tuner_plugin.sync.run_ranks`,
    the hook's real code with an in-memory MIN all-reduce) picks the version all ranks apply.

    When the retuner has written a new version, a snapshot is copied to every rank's config file, except that
    with probability ``p_fault`` one random rank's copy is delayed by 1..``max_delay`` steps, or (with
    probability ``p_drop`` of those) lost. Every ``resync_steps`` steps the distributor re-sends the newest
    snapshot to ranks that are behind (as a file poll would eventually notice it): a lost copy delays that
    rank, and so the agreed version, without stalling it forever. ``applied`` is the version in force for the
    step that follows.

    ``fault_stream`` says where a push's fault is drawn from: ``"push"`` (default) one stream in push order, so
    any change in the number of earlier pushes re-deals every later fault; ``"step"`` a stream keyed by (seed,
    step), so two retuner variants meet the same fault at the same step (common random numbers for A/B runs).
    """

    def __init__(self, src: str | os.PathLike, snap_dir: str | os.PathLike, *, seed: int = 0, p_fault: float = 0.2,
                 p_drop: float = 0.3, max_delay: int = 4, resync_steps: int = 3, fault_stream: str = "push") -> None:
        import random
        if fault_stream not in FAULT_STREAMS:
            raise ValueError(f"fault_stream must be one of {FAULT_STREAMS}, got {fault_stream!r}")
        self.src = os.fspath(src)
        self.snap_dir = os.fspath(snap_dir)
        os.makedirs(self.snap_dir, exist_ok=True)
        self.seed, self.fault_stream = seed, fault_stream
        self.rng = random.Random(seed)
        self.p_fault, self.p_drop, self.max_delay = p_fault, p_drop, max_delay
        self.pending: list[tuple[int, int, str]] = []
        self.resync_steps = resync_steps
        self.newest: str | None = None
        self.newest_version = 0
        self._stamp = None
        self.n_snap = 0
        self.faults = {"delayed": 0, "dropped": 0}
        self.applied = 0
        self.switches = 0

    def _rng_for(self, step: int):
        if self.fault_stream == "push":
            return self.rng
        import random
        return random.Random(self.seed * 1_000_003 + step)

    def __call__(self, rt, step: int) -> None:
        from dynamiccl.nccl_tuner_plugin import sync
        try:
            st = os.stat(self.src)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp is not None and stamp != self._stamp:
            self._stamp = stamp
            self.n_snap += 1
            snap = os.path.join(self.snap_dir, f"v{self.n_snap:06d}.conf")
            shutil.copyfile(self.src, snap)
            self.newest = snap
            try:
                from dynamiccl.nccl_tuner_plugin.config import read_configs
                cfgs = read_configs(snap)
                self.newest_version = cfgs[-1].version if cfgs else 0
            except (ValueError, OSError):
                pass
            self.pending += distribute(self._rng_for(step), rt.n_ranks, step, snap, p_fault=self.p_fault,
                                       p_drop=self.p_drop, max_delay=self.max_delay, faults=self.faults)
        due = sorted((p for p in self.pending if p[0] <= step), key=lambda p: p[0])
        self.pending = [p for p in self.pending if p[0] > step]
        if self.newest is not None and self.resync_steps and step % self.resync_steps == 0:
            for r, p in enumerate(rt.plugins):
                if p.staged_version < self.newest_version and not any(q[1] == r for q in self.pending):
                    due.append((step, r, self.newest))
        for _, r, path in due:
            rt.deliver(r, path)
        if due:
            rt.reload(sorted({r for _, r, _ in due}))
        applied = sync.run_ranks(rt.plugins)
        if applied[0] != self.applied:
            self.switches += 1
        self.applied = applied[0]


def make_rank_tuners(n_ranks: int, src: str | os.PathLike, workdir: str | os.PathLike, *, seed: int = 0,
                     p_fault: float = 0.2, fault_stream: str = "push"):
    """Every rank its own instance of the real plugin (agreement mode), fed by :class:`LossyDelivery`.
    Raises if the binding or the built ``.so`` is unavailable."""
    from dynamiccl.harness.simulator.engine_tuners import RankTuners
    hook = LossyDelivery(src, os.path.join(os.fspath(workdir), "snapshots"), seed=seed, p_fault=p_fault,
                         fault_stream=fault_stream)
    rt = RankTuners(n_ranks, os.path.join(os.fspath(workdir), "ranks"), mode="agree", step_hook=hook)
    rt.kind = "plugin-per-rank"
    rt.delivery = hook
    return rt


def make_file_tuner(path: str | os.PathLike, *, prefer_plugin: bool = True):
    """One instance of the real plugin (``dynamiccl.harness.simulator.engine_tuners.PluginTuner``, immediate mode, reloading ``path``
    at every step boundary) if available, else the Python reference :class:`FileTuner`; ``.kind`` says which."""
    if prefer_plugin:
        try:
            from dynamiccl.harness.simulator.engine_tuners import PluginTuner
            from dynamiccl.harness.simulator.tuner_abi import TunerPlugin
            plugin = TunerPlugin.private_copy()
            plugin.configure(os.fspath(path), mode="immediate", poll_ms=0)
            t = PluginTuner(plugin)

            def refresh() -> int:
                plugin.reload()
                return plugin.applied_version
            t.refresh = refresh
            t.kind = "plugin"
            return t
        except Exception as e:   # binding missing or .so not built: the Python reference, said so
            log.info("tuner plugin binding unavailable (%s); using the Python reference", e)
    return FileTuner(path)
