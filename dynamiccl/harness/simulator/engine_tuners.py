"""The engine's :class:`~dynamiccl.harness.simulator.engine.Tuner` protocol implemented with the real tuner plugin.

:class:`PluginTuner` asks one plugin instance (one process, as when every rank decides the same) with a
context per communicator, so ``SimulatedJob(..., tuner=PluginTuner())`` and ``Engine(..., tuner=...)`` take
their decisions from the real plugin.

:class:`RankTuners` gives every simulated rank its OWN plugin instance (a private copy of the ``.so``, so its
globals — staged and applied versions — are separate, as in separate processes) and its own config file; it
asks every member rank of a communicator for each decision and counts the collectives on which the ranks
disagree (:attr:`RankTuners.mismatches`).

Both drive the plugin through :class:`~dynamiccl.harness.simulator.tuner_abi.TunerPlugin` (NCCL's ABI over
ctypes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.harness.simulator.tuner_abi import TunerABIError, TunerPlugin

__all__ = ["PluginTuner", "RankTuners", "TunerDecision"]


@dataclass(frozen=True)
class TunerDecision:
    """What NCCL would run after the tuner: argmin cell of the returned table, channel budget, chunk."""
    algo: int
    proto: int
    n_channels: int
    chunk: int


def _argmin(table: np.ndarray) -> tuple[int, int] | None:
    flat = np.where(table >= 0, table, np.inf).reshape(-1)
    best = int(np.argmin(flat))
    if not np.isfinite(flat[best]):
        return None
    return divmod(best, table.shape[1])


class PluginTuner:
    """The engine's :class:`~dynamiccl.harness.simulator.engine.Tuner` backed by one plugin instance (one process, as when
    every rank's decision is the same): a plugin context per communicator, created on first use with the
    communicator's hash, rank and node counts, like NCCL's per-communicator ``init``. In a
    :class:`~dynamiccl.harness.simulator.driver.SimulatedJob` the node workers load the same plugin, so the profiler records
    carry :attr:`TunerPlugin.applied_version` as ``tuner_config_version``."""

    def __init__(self, plugin: TunerPlugin | str | os.PathLike | None = None, abi: int = 6, *,
                 step_hook: Callable[["PluginTuner", int], None] | None = None) -> None:
        self.plugin = plugin if isinstance(plugin, TunerPlugin) else TunerPlugin(plugin, abi)
        self.step_hook = step_hook
        self._ctx: dict[int, int] = {}

    def on_step(self, step: int) -> None:
        """Called by the engine at every step boundary: runs ``step_hook(self, step)`` (e.g. a reload, or the
        single-process agreement ``dynamiccl.nccl_tuner_plugin.sync.run_ranks([self.plugin])``)."""
        if self.step_hook is not None:
            self.step_hook(self, step)

    def context(self, comm) -> int:
        c = self._ctx.get(comm.comm_hash)
        if c is None:
            c = self._ctx[comm.comm_hash] = self.plugin.init(comm.comm_hash, comm.n_ranks, comm.n_nodes)
        return c

    def get_coll_info(self, comm, func: str, nbytes: int, cost_table: np.ndarray) -> tuple[np.ndarray, int]:
        return self.plugin.get_coll_info(self.context(comm), func, nbytes, cost_table)

    def get_chunk_size(self, comm, func: str, nbytes: int, algo: int, proto: int, n_channels: int,
                       chunk: int) -> int:
        return self.plugin.get_chunk_size(self.context(comm), func, nbytes, algo, proto, n_channels, chunk)

    def close(self) -> None:
        for c in self._ctx.values():
            self.plugin.finalize(c)
        self._ctx.clear()


class RankTuners:
    """Per-rank plugin instances (private copies of the ``.so``), each reading its own config file
    (``config_dir/rank-NNNN.conf``) with no reload thread, so the caller decides when each rank sees a
    delivery (:meth:`deliver`) and reloads (:meth:`reload`).

    As an engine :class:`~dynamiccl.harness.simulator.engine.Tuner`, every member rank of the communicator answers each
    ``getCollInfo``; the decision (argmin cell, channels, v6 chunk) of the communicator's first rank is
    returned and any disagreement between ranks is counted in :attr:`mismatches` (with the first few
    recorded in :attr:`mismatch_examples`). ``on_step`` (called by the engine at every step boundary)
    runs ``step_hook(self, step)`` if one is given: the place for deliveries and the agreement.
    """

    def __init__(self, n_ranks: int, config_dir: str | os.PathLike, *, mode: str = "agree",
                 plugin_path: str | os.PathLike | None = None, abi: int = 6,
                 step_hook: Callable[["RankTuners", int], None] | None = None) -> None:
        self.config_dir = Path(config_dir)
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self.mode = mode
        self.step_hook = step_hook
        self.plugins: list[TunerPlugin] = []
        self._ctx: list[dict[int, int]] = []
        self.mismatches = 0
        self.decisions = 0
        self.mismatch_examples: list[dict] = []
        self.applied_log: list[tuple[int, ...]] = []
        try:
            for r in range(n_ranks):
                p = TunerPlugin.private_copy(plugin_path, abi)
                self.plugins.append(p)
                p.configure(self.rank_path(r), mode=mode, poll_ms=0)
                self._ctx.append({})
        except BaseException:
            self.close()
            raise

    @property
    def n_ranks(self) -> int:
        return len(self.plugins)

    def rank_path(self, rank: int) -> Path:
        return self.config_dir / f"rank-{rank:04d}.conf"

    def deliver(self, rank: int, src: str | os.PathLike) -> None:
        """Deliver the file ``src`` to ``rank`` atomically (copy + rename), as a distribution step would."""
        atomic_write(self.rank_path(rank), Path(src).read_bytes(), fsync=False)

    def reload(self, ranks: Iterable[int] | None = None) -> list[int]:
        return [self.plugins[r].reload() for r in (range(self.n_ranks) if ranks is None else ranks)]

    def applied_versions(self) -> tuple[int, ...]:
        return tuple(p.applied_version for p in self.plugins)

    # ---- Tuner protocol -----------------------------------------------------------------------------------------
    def _context(self, rank: int, comm) -> int:
        d = self._ctx[rank]
        c = d.get(comm.comm_hash)
        if c is None:
            c = d[comm.comm_hash] = self.plugins[rank].init(comm.comm_hash, comm.n_ranks, comm.n_nodes)
        return c

    def decide(self, rank: int, comm, func: str, nbytes: int, cost_table: np.ndarray,
               default_chunk: int = 1 << 19) -> tuple[np.ndarray, int, TunerDecision | None]:
        p = self.plugins[rank]
        ctx = self._context(rank, comm)
        table, nch = p.get_coll_info(ctx, func, nbytes, cost_table)
        am = _argmin(table)
        if am is None:
            return table, nch, None
        chunk = p.get_chunk_size(ctx, func, nbytes, am[0], am[1], nch, default_chunk)
        return table, nch, TunerDecision(am[0], am[1], nch, chunk)

    def get_coll_info(self, comm, func: str, nbytes: int, cost_table: np.ndarray) -> tuple[np.ndarray, int]:
        out = [self.decide(r, comm, func, nbytes, cost_table) for r in comm.ranks]
        self.decisions += 1
        first = out[0][2]
        if any(o[2] != first for o in out[1:]):
            self.mismatches += 1
            if len(self.mismatch_examples) < 10:
                self.mismatch_examples.append({
                    "comm": comm.name, "func": func, "nbytes": nbytes,
                    "decisions": {r: o[2] for r, o in zip(comm.ranks, out)},
                    "applied": {r: self.plugins[r].applied_version for r in comm.ranks}})
        return out[0][0], out[0][1]

    def on_step(self, step: int) -> None:
        if self.step_hook is not None:
            self.step_hook(self, step)
        self.applied_log.append(self.applied_versions())

    def close(self) -> None:
        for p in self.plugins:
            try:
                p.close()
            except TunerABIError:
                pass
        self.plugins = []

    def __enter__(self) -> "RankTuners":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
