"""Which candidates to try: NCCL's model refitted to the measured change, plus what was measured before.

Round 1 (cells): the incumbent plus the ``max_cells`` (algo, proto) cells the refitted model
(:mod:`dynamiccl.retuner.model`) ranks cheapest, each at NCCL's channel count. A cell's prediction is multiplied by
its measured/modelled bias when this target has measured it before, so a cell NCCL's model misjudges on
this fabric moves to where the measurements put it. Cells predicted slower than ``max_pred_ratio`` x the
incumbent are not tried, nor cells whose in-flight-window lower bound under the fitted latency
(:meth:`~dynamiccl.retuner.model.CommModel.window_floor_us`, which NCCL's model lacks) is already that much slower than the
incumbent's measured time; neither are cells the allow/deny lists forbid or the plugin could not apply.
Later rounds (channels): the winner at half and twice its channel count, then one more step in the
direction that helped (coordinate descent, as AutoCCL does for its resource parameters).

Without a topology (``RetunerConfig.topology`` unset) there is no model: round 1 is the six Ring/Tree cells in
a fixed order and the plugin's own "cannot apply" feedback prunes them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from dynamiccl.retuner.config import RetunerConfig, _load_topology
from dynamiccl.retuner.model import NO_FIT, CommModel, Fit
from dynamiccl.retuner.types import Candidate, Target

__all__ = ["Planner", "Plan"]

_FALLBACK_CELLS = (("RING", "SIMPLE"), ("TREE", "SIMPLE"), ("RING", "LL128"), ("TREE", "LL128"), ("RING", "LL"),
                   ("TREE", "LL"))


@dataclass
class Plan:
    candidates: list[Candidate]
    fit: Fit = NO_FIT
    predicted_us: dict[Candidate, float] = field(default_factory=dict)   # refitted model µs x measured bias
    inc_pred_us: float | None = None                                    # the same for the incumbent's cell
    skipped: dict[str, str] = field(default_factory=dict)               # candidate/cell -> why
    ranked: list[tuple[tuple[str, str], float]] = field(default_factory=list)  # every cell, calibrated, best first


class Planner:
    def __init__(self, cfg: RetunerConfig) -> None:
        self.cfg = cfg
        self.topology = _load_topology(cfg.topology) if cfg.topology else None
        self._models: dict[tuple[int, int], CommModel | None] = {}

    def model(self, t: Target) -> CommModel | None:
        if self.topology is None or t.nranks < 2 or t.nnodes < 1:
            return None
        k = (t.nnodes, t.nranks)
        if k not in self._models:
            try:
                self._models[k] = CommModel(self.topology, nnodes=t.nnodes, nranks=t.nranks)
            except ValueError:
                self._models[k] = None
        return self._models[k]

    def cell_of(self, t: Target, cand: Candidate | None, observed: tuple[str, str] | None) -> tuple[str, str] | None:
        if cand is not None:
            return cand.algo, cand.proto
        if observed is not None:
            return observed
        m = self.model(t)
        return m.default_cell(t.func, t.nbytes()) if m is not None else None

    def fit(self, t: Target, kind: str, inc_cell: tuple[str, str] | None, ratio: float | None) -> Fit:
        m = self.model(t)
        if m is None or inc_cell is None or ratio is None:
            return NO_FIT
        return m.refit(kind, t.func, t.nbytes(), inc_cell, ratio)

    def cells(self, t: Target, *, kind: str, incumbent: Candidate | None, inc_cell: tuple[str, str] | None,
              ratio: float | None, bias: dict[tuple[str, str], float], unapplicable: set[Candidate],
              extra: list[Candidate] = (), max_cells: int | None = None,
              inc_measured_us: float | None = None) -> Plan:
        pol = self.cfg.policy
        max_cells = pol.max_cells if max_cells is None else max_cells
        m = self.model(t)
        plan = Plan([])
        if m is None:
            ranked = [(c, math.nan) for c in _FALLBACK_CELLS]
        else:
            plan.fit = self.fit(t, kind, inc_cell, ratio)
            ranked = m.ranked(t.func, t.nbytes(), plan.fit)
        inc_bias = bias.get(inc_cell, 1.0) if inc_cell else 1.0
        scored = []
        for cell, us in ranked:
            b = bias.get(cell, inc_bias)
            scored.append((cell, us * b if math.isfinite(us) else math.nan))
        if m is not None:
            scored.sort(key=lambda x: x[1])
        plan.ranked = list(scored)
        inc_pred = next((p for c, p in scored if c == inc_cell), math.nan)
        plan.inc_pred_us = inc_pred if math.isfinite(inc_pred) else None
        seen = {incumbent}
        if incumbent is None and inc_cell is not None:
            seen.add(Candidate(inc_cell[0], inc_cell[1], 0))      # NCCL's own choice is the incumbent
        for cand in extra:
            if cand not in seen and cand not in unapplicable and self.cfg.permitted(cand.algo, cand.proto, cand.n_channels):
                plan.candidates.append(cand)
                seen.add(cand)
        for cell, pred in scored:
            if len([c for c in plan.candidates if c not in extra]) >= max_cells:
                break
            cand = Candidate(cell[0], cell[1], 0)
            name = cand.name
            if cand in seen:
                continue
            if not self.cfg.permitted(*cell, 0):
                plan.skipped[name] = "denied"
                continue
            if cand in unapplicable:
                plan.skipped[name] = "unapplicable"
                continue
            if math.isfinite(pred) and math.isfinite(inc_pred) and pred > pol.max_pred_ratio * inc_pred:
                plan.skipped[name] = f"predicted {pred / inc_pred:.2f}x the incumbent"
                continue
            floor = m.window_floor_us(t.func, t.nbytes(), cell, 0, plan.fit) if m is not None else 0.0
            if inc_measured_us and floor > pol.max_pred_ratio * inc_measured_us:
                # NCCL's model has no latency-bandwidth window; a lower bound from it is enough to rule a cell out
                plan.skipped[name] = f"in-flight window alone {floor / inc_measured_us:.2f}x the incumbent's measured time"
                continue
            if math.isfinite(pred) and floor > pred:
                pred = floor                  # rank and prune it by what the window allows
            plan.candidates.append(cand)
            seen.add(cand)
            if math.isfinite(pred):
                plan.predicted_us[cand] = pred
        return plan

    def diverse(self, t: Target, plan: Plan, *, incumbent: Candidate | None, inc_cell: tuple[str, str] | None,
                unapplicable: set[Candidate], max_families: int,
                inc_measured_us: float | None = None) -> list[Candidate | None]:
        """Probes the refitted model cannot veto after a regime change: NCCL's default, then the best-ranked cell of
        each protocol and each algorithm that neither the plan nor the incumbent covers (at most ``max_families``).

        The refit is one scalar fitted to one cell's slowdown; when the regime hits cells unequally it can rank
        every other cell far behind a config that is now slower than NCCL's own choice. These probes are not
        predicted, so nothing prunes them before they are measured; the sequential test stops a slow one after
        ``min_samples`` collectives. Only a physical bound rules a family cell out: its in-flight window alone
        (:meth:`~dynamiccl.retuner.model.CommModel.window_floor_us`) already ``max_pred_ratio`` x slower than the
        incumbent's measured time.
        """
        m = self.model(t)
        out: list[Candidate | None] = []
        default_cell = m.default_cell(t.func, t.nbytes()) if m is not None else None
        if incumbent is not None:
            out.append(None)                             # NCCL's own choice: what a slower config is judged against
        cells = {(c.algo, c.proto) for c in plan.candidates if c is not None}
        cells |= {c for c in (inc_cell, default_cell) if c is not None}
        protos = {p for _, p in cells}
        algos = {a for a, _ in cells}
        ranked = [c for c, _ in plan.ranked] if m is not None else list(_FALLBACK_CELLS)
        added = 0
        for covered, part in ((protos, 1), (algos, 0)):
            for cell in ranked:
                if added >= max_families:
                    return out
                cand = Candidate(cell[0], cell[1], 0)
                if cell[part] in covered or cell in cells or cand in unapplicable or \
                        not self.cfg.permitted(cell[0], cell[1], 0):
                    continue
                if m is not None and inc_measured_us and m.window_floor_us(t.func, t.nbytes(), cell, 0, plan.fit) > \
                        self.cfg.policy.max_pred_ratio * inc_measured_us:
                    continue
                out.append(cand)
                cells.add(cell)
                protos.add(cell[1])
                algos.add(cell[0])
                added += 1
        return out

    def channels_of(self, t: Target, cand: Candidate | None, observed_channels: int | None = None) -> int | None:
        """The channel count ``cand`` runs with: its own, else what was observed, else NCCL's (model)."""
        if cand is not None and cand.n_channels > 0:
            return cand.n_channels
        if observed_channels:
            return observed_channels
        m = self.model(t)
        if m is None or cand is None:
            return None
        return m.default_channels(t.func, t.nbytes(), (cand.algo, cand.proto))

    def channel_limit(self, t: Target, cand: Candidate) -> int:
        m = self.model(t)
        return m.channel_limit((cand.algo, cand.proto)) if m is not None else 64

    def channel_variants(self, t: Target, cand: Candidate | None, factors: tuple[float, ...],
                         unapplicable: set[Candidate], observed_channels: int | None = None) -> list[Candidate]:
        """``cand`` at its channel count x each factor (clamped to NCCL's budget), permitted and new; its chunk kept."""
        if cand is None:
            return []
        ch = self.channels_of(t, cand, observed_channels)
        if not ch:
            return []
        lim = self.channel_limit(t, cand)
        out = []
        for f in factors:
            n = int(max(1, min(lim, round(ch * f))))
            c = Candidate(cand.algo, cand.proto, n, cand.chunk_bytes)
            if n != ch and c not in out and c not in unapplicable and self.cfg.permitted(c.algo, c.proto, n):
                out.append(c)
        return out
