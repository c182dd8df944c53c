"""Fusion: per-stream CUSUM alarms (+ autoencoder and rank evidence) → one `RegimeChange` per event.

Per window, after `dynamiccl.detector.streams.StreamTable.update`:

1. **Alarms are grouped** by (job, direction). Streams already in an active incident are
   absorbed into it (a ramp or a lagging stream never makes a second change); alarms within
   ``merge_s`` of an incident's detection or onset, or on a communicator the incident already
   covers, or within ``merge_similar_s`` of its onset with a similar shift (a wave of alarms
   over a big job), same job and direction, join it. 40 streams firing on one congestion event are one
   change.
2. **Evidence.** A new group becomes an incident at once when its shift is ≥ ``persist_ratio``
   and ≥ ``corroborate`` streams (with whole, settled windows) fired together, or when a
   straggler rank is visible. Otherwise (a lone alarm, or a small shift that a one-window
   hiccup could also cause) it waits up to ``confirm_windows`` windows for confirmation (values
   again ≥ ``confirm_z`` old sigmas away; two windows let an on/off bursty regime confirm); an
   unconfirmed one restores the streams' old baselines (no blind re-warm-up). Shifts below
   ``min_ratio`` are not regime changes (with ``small_shift_wait``, off by default, an
   unconfirmed group below it waits the same way: its alarm window may hold the onset). The per-stream CUSUM false-alarm rate is scaled with
   the number of streams (`StreamTable`), so more streams do not mean more false alarms. The
   job's autoencoder score and threshold go into the change's evidence (it flags one-window
   hiccups as readily as onsets, so it does not shorten the confirmation).
3. **The change** gets its onset from the CUSUM's last reset point (``change_start``, the first
   window of the alarming excursion), its kind (flapping if the same streams re-degrade soon
   after a recovery; straggler when one rank dominates the shortest durations or, the change
   being already justified, has by far the shortest durations relative to its peers; else
   bandwidth vs latency from the size response, `dynamiccl.detector.classify`; a degradation first seen,
   with a big shift, in the window holding its onset — partly the old regime — is classified
   one window later, `rank_waits`; so is a straggler named from that window alone,
   `straggler_recheck`, counter `rank_rechecks`), its magnitude (median new/old latency
   ratio over the fired streams) and where (communicators, collectives, size buckets, hosts,
   ranks).
4. **Tracking.** Each window, an incident's streams are placed between their old baseline (0)
   and their degraded level (1). ``recovery_windows`` consecutive windows at ≤
   ``recovery_fraction`` emit a ``recovery`` change (``recovers`` = the incident's id) and
   restore the streams' old baselines at once; ``flap_transitions`` off→on transitions within
   ``flap_window_s`` emit one ``flapping`` change.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from .config import DetectorConfig
from .events import RegimeChange
from .fusion_gates import FusionGates
from .fusion_queries import FusionQueries
from .fusion_rank import RankTrigger
from .incident import (MAX_EVIDENCE_STREAMS, MAX_INCIDENTS_PER_JOB, MAX_SILENT,
                       Incident, Pending, extend_group, new_group)
from .post_recovery import PostRecoveryHold
from .steps import StepRule
from .straggler import RankHistory
from .streams import StreamTable, WindowStreams
from .tracking import Tracking
from .wait_streams import is_wait, timing_of

MAX_ENDED = 4096   # transients closed (`TransientEnd`), waiting for the service (drained each window)

__all__ = ["Fusion", "Incident"]


class Fusion(FusionGates, RankTrigger, FusionQueries, Tracking):
    """Turns one window's stream alarms into regime changes; keeps incidents per job."""

    def __init__(self, config: DetectorConfig, table: StreamTable, ranks: RankHistory):
        self.config = config
        self.table = table
        self.ranks = ranks
        self.active: dict[str, list[Incident]] = {}
        self.closed: dict[str, deque] = {}
        self.stream_incident: dict[int, Incident] = {}
        self.pending: list[Pending] = []
        self.counters = {"recovery_drains": 0, "spikes_suppressed": 0, "small_shifts": 0, "alarms_absorbed": 0,
                         "alarms_merged": 0, "incidents_dropped": 0, "pending_dropped": 0,
                         "workload_changes": 0, "autoencoder_flags": 0, "network_only": 0,
                         "rank_triggers": 0, "rank_waits": 0, "small_waits": 0,
                         "rank_rechecks": 0, "onset_waits": 0, "transients": 0, "softer_releases": 0,
                         "paced_kind_now": 0, "warmups_trimmed": 0}
        self.counters["paced_preconfirmed"] = 0   # paced warm-up alarms confirmed by their own samples
        self.counters["onset_level_holds"] = 0    # alarms held: level since onset below the bar (`onset_level`)
        self.counters["preconfirmed"] = 0         # alarms on two windows beyond the confirm bar (`preconfirm`)
        self.counters["post_recovery_holds"] = 0  # degradations soon after a recovery held a window (`post_recovery`)
        self.counters["improvements_adopted"] = 0  # improvements that became the baseline (`adopt_improvement`)
        self.counters["incidents_dissolved"] = 0   # incidents whose streams all left them (re-baselined)
        self.post_recovery = PostRecoveryHold(self)
        # transients closed without a recovery (`TransientEnd`): the service ends their gauges
        # and hands them on; bounded, drained every window
        self.ended: deque = deque(maxlen=MAX_ENDED)
        self._n: dict[str, int] = {}
        self._rebased_at: dict[str, int] = {}
        self.steps = StepRule(config, table, self._next_id, self.counters)
        self._step_fresh: list = []
        table.incident_level = self.incident_level

    def incident_level(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(level, pre-change sigma) of streams ``idx`` in an open incident, NaN elsewhere."""
        level, scale = np.full(idx.size, np.nan), np.full(idx.size, np.nan)
        if not self.stream_incident or idx.size == 0:
            return level, scale
        held = np.fromiter(self.stream_incident, np.int64, len(self.stream_incident))
        by_inc: dict[int, tuple[Incident, list[int]]] = {}
        for n in np.flatnonzero(np.isin(idx, held)).tolist():
            inc = self.stream_incident[int(idx[n])]
            if inc.rank_of is None and inc.streams.size:
                by_inc.setdefault(id(inc), (inc, []))[1].append(n)
        for inc, rows in by_inc.values():
            ns = np.asarray(rows, np.int64)
            order = np.argsort(inc.streams)
            j = order[np.minimum(np.searchsorted(inc.streams, idx[ns], sorter=order), inc.streams.size - 1)]
            ok = inc.streams[j] == idx[ns]
            level[ns[ok]], scale[ns[ok]] = inc.level[j[ok]], inc.base_scale[j[ok]]
        return level, scale

    def _next_id(self, job: str) -> str:
        n = self._n.get(job, 0) + 1
        self._n[job] = n
        return f"rc-{job}-{n}"

    # ------------------------------------------------------------------ public
    def active_changes(self) -> list[RegimeChange]:
        return [inc.change for incs in self.active.values() for inc in incs]

    def process(self, ws: WindowStreams, window_s: float, ae: dict[str, tuple[float, float]] | None = None
                ) -> list[RegimeChange]:
        ae = ae or {}
        out: list[RegimeChange] = []
        self._window_s = window_s
        if ws.evicted is not None and ws.evicted.size:
            self._forget_evicted(ws.evicted)
        if ws.rebased.size:
            self._forget_streams(ws.rebased)
            # a workload change moves the job's other streams (arrival coupling) only if
            # its collectives take a real share of the job's time: a scalar AllReduce
            # changing size every few seconds is not a reason to ignore alarms; nor is a
            # stream's coverage alone (one window short of a rank's records: a collective
            # straddling the window's end), which changes no one's timing
            resized = ws.rebased if ws.resized is None else ws.resized
            for j in set(self.table.job[resized].tolist()):
                if self._time_share(j, resized) >= self.config.workload.settle_share:
                    self._rebased_at[j] = ws.t
        groups = self._confirm_pending(ws)
        self._step_fresh = []
        self._group_alarms(ws, groups)
        live = {id(inc) for incs in self.active.values() for inc in incs}
        out += self.steps.process(ws, window_s, self._step_fresh, live)
        created = set()
        for (job, direction), g in groups.items():
            inc, change = self._judge(ws, job, direction, g, ae)
            if change is not None:
                out.append(change)
            if inc is not None:
                created.add(inc.id)
        for inc, change in self._rank_trigger(ws, ae):
            out.append(change)
            created.add(inc.id)
        for job in list(self.active):
            for inc in list(self.active[job]):
                if inc.id not in created:
                    ch = self._track(ws, inc)
                    if ch is not None:
                        out.append(ch)
        return out

    # ------------------------------------------------------------------ steps
    def _forget_streams(self, idx: np.ndarray) -> None:
        for i in idx.tolist():
            inc = self.stream_incident.pop(i, None)
            if inc is not None:
                # its pre-change baseline is the one of the workload it left
                j = np.flatnonzero(inc.streams == i)
                if j.size and np.isfinite(inc.base_scale[j[0]]) and inc.base_scale[j[0]] > 0:
                    self.table.adopt_previous([i], inc.base_med[j[0]], inc.base_scale[j[0]])
                inc.drop(np.array([i]))
        self._drop_pending(idx)

    def _drop_pending(self, idx: np.ndarray) -> None:
        for p in self.pending:
            keep = ~np.isin(p.idx, idx)
            p.idx, p.med, p.scale, p.start = p.idx[keep], p.med[keep], p.scale[keep], p.start[keep]

    def _forget_evicted(self, idx: np.ndarray) -> None:
        """Streams unseen for ``streams.idle_s`` were forgotten (their slots go to new streams): they
        leave their incidents and pending groups. An incident left with none (its job stopped) ends
        at its next tracking (`Tracking._track`): its gauges and alert do not outlive the job. Not
        `_forget_streams`: its hand-over of a pre-change baseline would write into the freed slot."""
        for i in idx.tolist():
            self.stream_incident.pop(i, None)
        for inc in (inc for incs in self.active.values() for inc in incs):
            if np.isin(inc.streams, idx).any():
                inc.drop(idx)
        self._drop_pending(idx)

    def _confirm_pending(self, ws: WindowStreams) -> dict:
        groups: dict[tuple[str, int], dict] = {}
        keep = []
        for p in self.pending:
            if p.idx.size == 0:
                continue
            cur = self.table.current(p.idx)
            ok = np.isfinite(cur)
            if ok.any():
                z = (cur[ok] - p.med[ok]) / p.scale[ok] * p.direction
                if np.median(z) >= self.config.fusion.confirm_z:
                    g = groups.setdefault((p.job, p.direction), new_group())
                    extend_group(g, p.idx, p.med, p.scale, p.start, confirmed=True)
                    g["peak"] = g.get("peak", False) or p.peak
                    continue
            # not (yet) confirmed: a bursty regime (on/off every window) gets a second window;
            # a one-window hiccup does not come back. A window with no value of its streams (a
            # sparse stream between samples, `dynamiccl.detector.sparse`) is no try, up to MAX_SILENT;
            # a dense stream's silence is a pause, and its alarm is judged as before
            with np.errstate(invalid="ignore"):
                sparse = bool((self.table.instances_ref[p.idx] < self.config.streams.min_instances).all())
            # so is a window between the steps of a step-paced job (`dynamiccl.detector.sparse.JobCadence`)
            sparse = sparse or self.table.cadence.paced(int(self.table.job_code[p.idx[0]]), self._window_s)
            if not ok.any() and sparse and p.silent < MAX_SILENT:
                p.silent += 1
                keep.append(p)
                continue
            p.tries += 1
            if p.tries < self.config.fusion.confirm_windows:
                keep.append(p)
            else:
                self.table.restore_baseline(p.idx, p.med, p.scale)
                self.counters["spikes_suppressed"] += 1
        self.pending = keep
        return groups

    def _group_alarms(self, ws: WindowStreams, groups: dict) -> None:
        if ws.fired.size == 0:
            return
        tab = self.table
        si = self.stream_incident
        fired = ws.fired
        new = np.fromiter((i not in si for i in fired.tolist()), bool, fired.size)
        self.counters["alarms_absorbed"] += int(fired.size - new.sum())
        if not new.all():          # alarms of an incident's streams: a deeper or softer step?
            old = np.flatnonzero(~new)
            self._step_fresh = self.steps.collect(ws, old, [si[int(fired[p])] for p in old.tolist()])
        if not new.any():
            return
        codes = tab.job_code[fired].astype(np.int64) * 2 + (ws.direction > 0)
        for code in np.unique(codes[new]).tolist():
            m = new & (codes == code)
            first = int(fired[np.argmax(m)])
            g = groups.setdefault((tab.job[first], 1 if code % 2 else -1), new_group())
            # a step-paced stream's warm-up alarm may rest on two successive samples already
            # beyond the confirmation bar (`dynamiccl.detector.paced_warmup.PacedConfirm`)
            pre = bool(np.all(tab.early.sparse.confirmed_at[fired[m]] == ws.t))
            self.counters["paced_preconfirmed"] += int(pre)
            extend_group(g, fired[m], ws.base_median[m], ws.base_scale[m], ws.start_step[m], confirmed=pre)

    def _create(self, ws, job, direction, idx, med, scale, level, onset_step, ae_score, ae_thr, stragglers):
        cfg, tab = self.config, self.table
        lr = level - med
        order = np.argsort(-np.abs(np.nan_to_num(lr)))
        idx, med, scale, level, lr = idx[order], med[order], scale[order], level[order], lr[order]
        comms_h = list(dict.fromkeys(tab.comm_hash[idx].tolist()))
        evidence: dict = {"n_streams": int(idx.size), "arl0": float(tab.arl0),
                          # the delay in instances of the change's collectives (onset window on)
                          "delay_instances": tab.instances_since(idx, onset_step)}
        kind = None
        ranks: list[int] = []
        hosts: list[str] = []
        if direction > 0:
            if not stragglers:
                stragglers = self._stragglers(job, idx, onset_step, rel=True)
            if stragglers:
                best = stragglers[0]
                evidence["stragglers"] = [
                    {"comm": f"0x{c.comm_hash:x}", "rank": c.rank, "host": c.host, "share": round(c.share, 3),
                     "instances": c.instances, "rule": c.rule} for c in stragglers[:8]]
                if kind is None:
                    kind = "straggler"
                    comms_h = [best.comm_hash] + [c for c in comms_h if c != best.comm_hash]
                    ranks = [best.rank] + [c.rank for c in stragglers[1:] if c.host == best.host
                                           and c.comm_hash != best.comm_hash]
                    hosts = [best.host]
        if kind is None:
            kind, evidence["size_response"] = self._size_response(job, idx, med, scale, onset_step)
            # flapping: the same streams degrade again soon after a short episode recovered
            prev = self._recent_episode(job, idx, direction, ws.t)
            if prev is not None:
                evidence["previous"] = prev.ids
                kind = "flapping"
        if not hosts:
            hosts = self._hosts(job, comms_h)
        magnitude = float(np.exp(np.nanmedian(lr))) if np.isfinite(lr).any() else 1.0
        n = self._n.get(job, 0) + 1
        self._n[job] = n
        cid = f"rc-{job}-{n}"
        _, first = np.unique(tab.comm_hash[idx], return_index=True)
        names = {int(tab.comm_hash[idx[j]]): tab.comm_name[idx[j]] for j in first.tolist()}
        evidence["streams"] = [
            {"comm": f"0x{int(tab.comm_hash[i]):x}", "comm_name": tab.comm_name[i], "func": tab.func[i],
             "size_bucket": int(tab.size_bucket[i]), "ratio": round(float(np.exp(r)), 4),
             "z": round(float(r / s), 2) if s > 0 else None}
            for i, r, s in zip(idx[:MAX_EVIDENCE_STREAMS].tolist(), lr[:MAX_EVIDENCE_STREAMS].tolist(),
                               scale[:MAX_EVIDENCE_STREAMS].tolist())]
        timing = timing_of(tab.func[idx].tolist())
        if timing:      # waits for the last rank to enqueue stand in for untimed durations (`wait_streams`)
            evidence["timing"] = timing
            for s in evidence["streams"]:
                if is_wait(s["func"]):
                    s["timing"] = "wait"
        if math.isfinite(ae_score):
            evidence["autoencoder_score"] = round(float(ae_score), 4)
            evidence["autoencoder_threshold"] = round(float(ae_thr), 4) if math.isfinite(ae_thr) else None
        change = RegimeChange(
            id=cid, kind=kind, job_id=job,
            start_s=float(tab.window_start_of(onset_step)), detected_s=float(ws.window_start + self._window_s),
            magnitude=round(magnitude, 4), comms=[f"0x{c:x}" for c in comms_h],
            comm_names=[names.get(c, "") for c in comms_h],
            funcs=sorted(set(tab.func[idx].tolist())),
            size_buckets=sorted(set(tab.size_bucket[idx].tolist())),
            ranks=ranks, hosts=hosts, evidence=evidence)
        inc = Incident(cid, job, kind, direction, idx, med, scale, level, onset_step, ws.t, change)
        self._register(job, inc)
        return inc, change

    def _recent_episode(self, job, idx, direction, t) -> Incident | None:
        """A closed incident of the same job and direction, on mostly the same streams, that
        lasted and ended within ``flap_window_s / 2``."""
        half = 0.5 * self.config.incidents.flap_window_s / self._window_s
        for old in reversed(self.closed.get(job, ())):
            if old.direction != direction or old.closed_step is None:
                continue
            if t - old.closed_step > half or old.closed_step - old.onset_step > half:
                continue
            overlap = np.isin(idx, old.streams).sum()
            if overlap >= 0.5 * min(len(idx), len(old.streams)):
                return old
        return None

    def _register(self, job: str, inc: Incident) -> None:
        lst = self.active.setdefault(job, [])
        lst.append(inc)
        for i in inc.streams.tolist():
            self.stream_incident[i] = inc
        if len(lst) > MAX_INCIDENTS_PER_JOB:
            old = lst.pop(0)
            self._release(old)
            self.counters["incidents_dropped"] += 1
            self.ended.append(old.end(inc.change.detected_s, inc.change.detected_s, 1.0))   # no longer tracked

    def _release(self, inc: Incident) -> None:
        for i in inc.streams.tolist():
            if self.stream_incident.get(i) is inc:
                del self.stream_incident[i]
