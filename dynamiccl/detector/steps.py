"""Steps inside an incident: a degraded regime that gets deeper or softer is a change too.

After an incident's alarm its streams re-learn their level (`dynamiccl.detector.self_start`: a short
warm-up, the old scale pooled in), so a new alarm of those streams means the level moved again.
The alarms of one incident in a window are a *step candidate*, reported when

1. its shift from the re-learnt level is at least ``step_ratio`` (median over its streams);
2. it is not a return to the pre-incident baseline (position ≤ ``recovery_fraction`` of the
   incident's shift: the recovery rule owns that);
3. the incident is not flapping (on/off is its nature, not a new regime);
4. it is corroborated: ``corroborate`` streams alarmed together, or the next window confirms it
   (median ≥ ``confirm_z`` re-learnt sigmas in its direction); else the streams' re-learnt
   baselines come back;
5. it is not a lagging part of a step of the same sense reported within ``merge_s``.

A step is a change of the incident's kind with a new id, ``evidence.step`` = ``"deeper"`` or
``"softer"`` and ``evidence.follows`` = the change it supersedes; the incident's level moves to
the new one, and its recovery (to the pre-incident baseline) ends every id of the incident.
Before this rule a step was absorbed into the incident: after a throttle, a deeper throttle
10 s later and a softer one 10 s after that went unreported.

With a fixed 60-window re-learn the streams' own alarms come a minute late; an incident's
tracking (`dynamiccl.detector.tracking`) reports deeper steps through `StepRule.level_step`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .events import RegimeChange

__all__ = ["StepCandidate", "StepRule"]


@dataclass
class StepCandidate:
    inc: object            # fusion.Incident
    direction: int
    idx: np.ndarray
    med: np.ndarray        # re-learnt baseline (log) per stream
    scale: np.ndarray
    start: np.ndarray
    step: int
    waited: bool = False


class StepRule:
    """Collects step candidates per window and turns the corroborated ones into changes."""

    def __init__(self, config, table, new_id, counters: dict):
        self.config = config
        self.table = table
        self._new_id = new_id        # job -> a fresh change id
        self.waiting: list[StepCandidate] = []
        self.counters = counters     # the fusion's: steps, steps_unconfirmed, steps_small
        self._last: dict[int, tuple[int, bool]] = {}   # incident -> (step, deeper) of its last step
        for name in ("steps", "steps_unconfirmed", "steps_small", "steps_merged", "level_steps"):
            counters.setdefault(name, 0)

    def collect(self, ws, fired_pos: np.ndarray, incidents: list) -> list[StepCandidate]:
        """Step candidates from the alarms ``ws.fired[fired_pos]`` of streams already in the
        incidents ``incidents`` (one per position)."""
        out: dict[tuple[int, int], StepCandidate] = {}
        for p, inc in zip(fired_pos.tolist(), incidents):
            if inc.rank_of is not None:
                continue
            key = (id(inc), int(ws.direction[p]))
            c = out.get(key)
            i = np.array([ws.fired[p]])
            if c is None:
                out[key] = StepCandidate(inc, int(ws.direction[p]), i, ws.base_median[p:p + 1],
                                         ws.base_scale[p:p + 1], ws.start_step[p:p + 1], ws.t)
            else:
                c.idx = np.concatenate([c.idx, i])
                c.med = np.concatenate([c.med, ws.base_median[p:p + 1]])
                c.scale = np.concatenate([c.scale, ws.base_scale[p:p + 1]])
                c.start = np.concatenate([c.start, ws.start_step[p:p + 1]])
        return list(out.values())

    def process(self, ws, window_s: float, fresh: list[StepCandidate], active: set) -> list[RegimeChange]:
        """Judge this window's candidates and last window's waiting ones."""
        cfg, tab = self.config, self.table
        changes: list[RegimeChange] = []
        waiting, self.waiting = self.waiting, []
        for c in waiting:
            if id(c.inc) not in active:
                continue
            cur = tab.current(c.idx)
            ok = np.isfinite(cur)
            z = (cur[ok] - c.med[ok]) / c.scale[ok] * c.direction
            if ok.any() and float(np.median(z)) >= cfg.fusion.confirm_z:
                ch = self._judge(ws, window_s, c, cur)
                if ch is not None:
                    changes.append(ch)
            else:
                self.counters["steps_unconfirmed"] += 1
                tab.restore_baseline(c.idx, c.med, c.scale)
        for c in fresh:
            if c.inc.kind == "flapping" or c.inc.flapping_id is not None:
                continue
            cur = tab.current(c.idx)
            if c.idx.size >= cfg.fusion.corroborate:
                ch = self._judge(ws, window_s, c, cur)
                if ch is not None:
                    changes.append(ch)
            else:
                self.waiting.append(c)
        return changes

    def level_step(self, ws, window_s: float, inc, ok: np.ndarray, cur: np.ndarray, from_step: int):
        """A step seen by the incident's tracking (`dynamiccl.detector.tracking`): its streams
        ``ok`` moved from the tracked level to ``cur`` since ``from_step``; judged as a
        corroborated candidate against that level."""
        c = StepCandidate(inc, inc.direction, inc.streams[ok], inc.level[ok].copy(), inc.base_scale[ok],
                          np.array([from_step], np.int64), ws.t)
        self.counters["level_steps"] += 1
        return self._judge(ws, window_s, c, cur[ok])

    def _judge(self, ws, window_s: float, c: StepCandidate, cur: np.ndarray) -> RegimeChange | None:
        cfg, tab, inc = self.config, self.table, c.inc
        ok = np.isfinite(cur)
        if not ok.any():
            return None
        step_lr = float(np.median(cur[ok] - c.med[ok]))
        if abs(step_lr) < math.log(cfg.incidents.step_ratio):
            self.counters["steps_small"] += 1
            return None
        pos = _positions(inc.streams, c.idx)
        have = pos >= 0
        shift = np.where(have, inc.level[np.maximum(pos, 0)] - inc.base_med[np.maximum(pos, 0)], np.nan)
        base = np.where(have, inc.base_med[np.maximum(pos, 0)], np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            where = (cur - base) / shift
        good = ok & have & np.isfinite(where) & (shift != 0)
        if good.any() and float(np.median(where[good])) <= cfg.incidents.recovery_fraction:
            return None          # back to the pre-incident regime: the recovery rule's call
        inc.level[pos[good]] = cur[good]
        inc.level_step = ws.t
        deeper = step_lr * inc.direction > 0
        last = self._last.get(id(inc))
        if last is not None and last[1] == deeper and (ws.t - last[0]) * window_s <= cfg.incidents.merge_s:
            self.counters["steps_merged"] += 1     # a lagging stream of the step just reported
            return None
        self._last[id(inc)] = (ws.t, deeper)
        prev = inc.change
        cid = self._new_id(inc.job)
        to_base = float(np.exp(np.median(cur[good] - base[good]))) if good.any() else float("nan")
        change = RegimeChange(
            id=cid, kind=inc.kind, job_id=inc.job, start_s=float(tab.window_start_of(int(c.start.min()))),
            detected_s=float(ws.window_start + window_s), magnitude=round(float(np.exp(step_lr)), 4),
            comms=prev.comms, comm_names=prev.comm_names, funcs=prev.funcs, size_buckets=prev.size_buckets,
            ranks=prev.ranks, hosts=prev.hosts,
            evidence={"step": "deeper" if deeper else "softer", "follows": prev.id,
                      "ratio_to_baseline": round(to_base, 4) if math.isfinite(to_base) else None,
                      "n_streams": int(c.idx.size)})
        inc.change = change
        inc.step_ids.append(cid)
        self.counters["steps"] += 1
        return change


def _positions(streams: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Position of each of ``idx`` in ``streams`` (-1 if absent)."""
    where = {int(s): k for k, s in enumerate(streams.tolist())}
    return np.array([where.get(int(i), -1) for i in idx.tolist()], np.int64)
