"""The agent's one seam to the learned policy: re-rank round 1 of an exploration.

The agent computes the model-guided plan as always (fit, bias, skipped cells); :func:`learned_plan` replaces its
candidate list and predictions by the learned policy's ranking. Everything else — dry run, allow/deny lists,
pins, the exploration budget, sequential probing with early stopping, commit/verify/rollback, memory,
recognition, consistent switching through the tuner plugin and the audit — stays in the agent. Without a model
of the communicator (no topology) there is no cell mask, so the model-guided plan is kept.
"""
from __future__ import annotations

import math

from dynamiccl.nccl_model.cost_model import ALGOS, PROTOS
from dynamiccl.retuner.learned.actions import CH_FACTORS, chunk_of
from dynamiccl.retuner.learned.policy import LearnedPolicy
from dynamiccl.retuner.learned.state import SEQ, Decision
from dynamiccl.retuner.types import Candidate

__all__ = ["learned_plan"]

_TOP_VALUES = 6          # action values written to the audit line (the policy's reasons)


def _history(ts, incumbent, onset: float | None) -> tuple:
    hist = list(ts.history)[-4 * SEQ:]
    base = [h[3] for h in hist if h[5] == incumbent and (onset is None or h[1] <= onset)]
    ref = sorted(base)[len(base) // 2] if base else (hist[0][3] if hist else None)
    if not ref:
        return ()
    return tuple((math.log(max(h[3], 1e-12) / ref), math.sqrt(max(h[4], 0.0)) / max(h[3], 1e-12) or 0.02,
                  float(h[5] != incumbent)) for h in hist[-SEQ:])


def _no_gain_at_start(x, chosen: list, rel_time: float, max_rel: float | None) -> bool:
    """Start-up (nothing changed, NCCL's choice is the incumbent): a candidate predicted no faster than NCCL's choice
    has no predicted gain, only its probe's cost, so it is not probed -- except the best-ranked one, so the policy's
    first guess is always measured once (its start-up predictions err by up to ~10 % either way)."""
    return max_rel is not None and x.trigger == "start" and bool(chosen) and rel_time >= max_rel


def _label(r) -> str:
    base = f"{r.cell[0]}/{r.cell[1]}/x{r.ch_factor:g}"
    return base if r.ck_factor == 1.0 else f"{base}/ck{r.ck_factor:g}"


def learned_plan(policy: LearnedPolicy, planner, cfg, ts, x, plan, *, ratio: float | None, inc_cell, rc,
                 unapplicable: set, max_cells: int, inc_measured_us: float | None):
    """(plan with the learned ranking, audit info). ``plan`` is the model-guided plan of the same round."""
    t = ts.target
    m = planner.model(t)
    if m is None or inc_cell is None:
        return plan, {"policy": "learned", "fallback": "no model of this communicator: model-guided plan kept"}
    nb = t.nbytes()
    enabled = frozenset(m.cells(t.func, nb))
    tab = m.table(t.func, nb, plan.fit)
    inc_t = tab[ALGOS.index(inc_cell[0]), PROTOS.index(inc_cell[1])]
    rel = {c: float(tab[ALGOS.index(c[0]), PROTOS.index(c[1])] / inc_t) for c in enabled if inc_t > 0}
    inc = x.incumbent if x.incumbent is not None else Candidate(inc_cell[0], inc_cell[1], 0)
    kind = "start" if x.trigger == "start" else (x.kind if x.kind in ("bandwidth", "latency") else "other")
    d = Decision(t.func, t.size_bucket, t.nranks, t.nnodes, kind, inc_cell,
                 planner.channels_of(t, inc, ts.observed_channels) or 1, ratio if ratio and kind != "start" else 1.0,
                 enabled, rel, _history(ts, x.incumbent, rc.start_s if rc is not None else None), t.comm_name,
                 float((getattr(rc, "evidence", None) or {}).get("ae_error", 0.0) or 0.0))
    ranked = policy.rank(d)
    scale = inc_measured_us or plan.inc_pred_us or 1.0
    out = type(plan)([], fit=plan.fit, inc_pred_us=scale, skipped=dict(plan.skipped))
    seen = {inc}
    for r in ranked:
        if len(out.candidates) >= max_cells:
            break
        if r.ck_factor != 1.0 and not cfg.policy.learned_chunk_choices:
            continue
        ch = 0
        if r.ch_factor != CH_FACTORS[0]:
            dch = planner.channels_of(t, Candidate(r.cell[0], r.cell[1], 0)) or 0
            ch = int(max(1, min(planner.channel_limit(t, Candidate(r.cell[0], r.cell[1], 0)), round(dch * r.ch_factor))))
        ck = chunk_of(r.cell[1], m.default_chunk(t.func, nb, r.cell, ch), r.ck_factor)
        if ck is None:       # below the protocol's grain: masked
            continue
        c = Candidate(r.cell[0], r.cell[1], ch, ck)
        if c in seen or c in unapplicable or not cfg.permitted(c.algo, c.proto, c.n_channels):
            continue
        if not cfg.policy.learned_cell_variants and any((o.algo, o.proto) == r.cell for o in out.candidates):
            continue
        if r.rel_time > cfg.policy.max_pred_ratio:
            out.skipped[c.name] = f"learned: predicted {r.rel_time:.2f}x the incumbent"
            continue
        if _no_gain_at_start(x, out.candidates, r.rel_time, cfg.policy.learned_start_max_rel):
            out.skipped[c.name] = f"learned: start-up, predicted {r.rel_time:.2f}x NCCL's choice (no gain to repay the probe)"
            continue
        seen.add(c)
        out.candidates.append(c)
        out.predicted_us[c] = r.rel_time * scale
    info = {"policy": "learned", "state_ratio": d.ratio,
            "action_values": {_label(r): round(r.value, 4)
                              for r in ranked[:_TOP_VALUES]}}
    return out, info
