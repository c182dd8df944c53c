"""The node collector: its ranks' decoded records → one partial per event-time window → the outbox.

``consume`` only files records under their window (bounded: past ``max_buffered_records`` the batch's
excess is dropped and counted, never blocked). ``tick`` closes the windows whose end plus the allowed
lateness lies behind the newest event time seen, builds their partials and flushes the outbox. The
counters (received, aggregated, dropped by reason, windows, partials emitted/dropped, send errors,
bytes sent) are the node's own ``/metrics`` (:func:`registry`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynamiccl.collector.records import event_time_ns, valid_mask
from dynamiccl.contracts.partition import check_partitions
from dynamiccl.scaleout.bus import Message, Outbox, msg_id, subject, unit
from dynamiccl.collector.processors.wait import LOSSY_SHARE, LostRecords
from dynamiccl.collector.processors.wait_losses import LossLedger, note_windows
from dynamiccl.scaleout.partials import node_partial, split_partial
from dynamiccl.scaleout.waits import MAX_WAIT_RECORDS, lossy_comms
from dynamiccl.scaleout.window_store import ColumnPool, WindowColumns
from dynamiccl.scaleout.wire import MAX_MESSAGE_BYTES, encode_messages, raw_size

__all__ = ["NodeConfig", "NodeCollector", "registry", "NOTE_AHEAD_WINDOWS"]

#: windows past the newest open one a noted lost record may be attributed to (further: the next to close)
NOTE_AHEAD_WINDOWS = 16


@dataclass(frozen=True)
class NodeConfig:
    node: str
    job_id: str
    window_s: float = 1.0
    allowed_lateness_s: float = 2.0
    max_buffered_records: int = 4_000_000   # all open windows together (~8 ranks × 550/s × 3 s ≈ 13 k)
    max_message_bytes: int = MAX_MESSAGE_BYTES  # the bus's max payload: a larger partial goes in parts
    inputs_authenticated: bool = False      # every peer of the node's receiver presents a token (wire "auth")
    partitions: int = 1                     # communicator partitions of the job (1: the whole job, one subject)
    # the node's untimed collective records go upstream so the merger forms the wait streams (scaleout/waits.py)
    wait_streams: bool = True
    max_wait_records: int = MAX_WAIT_RECORDS  # per window; past it none are sent (counted waits_cut)

    def validate(self) -> None:
        subject(self.job_id, self.node)        # both must be subject tokens
        check_partitions(self.partitions)
        if not self.window_s > 0 or self.allowed_lateness_s < 0 or self.max_buffered_records < 1:
            raise ValueError(f"node config: window_s > 0, allowed_lateness_s >= 0, max_buffered_records >= 1 "
                             f"(got {self.window_s}, {self.allowed_lateness_s}, {self.max_buffered_records})")
        if self.max_wait_records < 1:
            raise ValueError(f"node config: max_wait_records >= 1 (got {self.max_wait_records})")
        if not 4096 <= self.max_message_bytes <= MAX_MESSAGE_BYTES:
            raise ValueError(f"node config: 4096 <= max_message_bytes <= {MAX_MESSAGE_BYTES} "
                             f"(got {self.max_message_bytes})")


class NodeCollector:
    def __init__(self, config: NodeConfig, outbox: Outbox):
        config.validate()
        self.config, self.outbox = config, outbox
        self._win_ns = int(round(config.window_s * 1e9))
        self._late_ns = int(round(config.allowed_lateness_s * 1e9))
        self._open: dict[int, WindowColumns] = {}
        self._pool = ColumnPool()
        self._ratio: float | None = None           # compressed / raw bytes of the last partial
        self._buffered = 0
        self._newest_ns = -1
        self._closed_upto = -1 << 62
        self.counters = {"received": 0, "aggregated": 0, "windows": 0, "dropped_invalid": 0,
                         "dropped_late": 0, "dropped_buffer_full": 0, "dropped_unencodable": 0,
                         "split_partials": 0, "waits_cut": 0, "waits_lossy_windows": 0, "waits_lossy_comms": 0,
                         "waits_lossy_folded": 0, "waits_lossy_noted": 0}
        # records dropped late / buffer full since the last close, per communicator (hash; past
        # MAX_LOSSY_COMMS of them, against the whole node-window): the waits' lossy rule (scaleout/waits.py)
        self._lost = LostRecords()
        # records lost before the node (its queue full, the receiver's floods and record_seq jumps), told as
        # notes from other threads (collector/processors/wait_losses.py), attributed at the next close to the
        # windows they say (per communicator; a jump's, of no communicator, to the whole node-window)
        self.losses = LossLedger()
        self._lost_at: dict[int, LostRecords] = {}

    def consume(self, ev: np.ndarray) -> None:
        c = self.counters
        c["received"] += len(ev)
        ok = valid_mask(ev)
        if not ok.all():
            c["dropped_invalid"] += int((~ok).sum())
            ev = ev[ok]
        t = event_time_ns(ev)
        w = t // self._win_ns
        late = w < self._closed_upto
        if late.any():
            c["dropped_late"] += int(late.sum())
            c["waits_lossy_folded"] += self._lost.dropped(0, ev["comm_hash"][late])
            ev, t, w = ev[~late], t[~late], w[~late]
        room = self.config.max_buffered_records - self._buffered
        if len(ev) > room:
            c["dropped_buffer_full"] += len(ev) - room
            c["waits_lossy_folded"] += self._lost.dropped(0, ev["comm_hash"][room:])
            ev, t, w = ev[:room], t[:room], w[:room]
        if not len(ev):
            return
        lo, hi = int(w.min()), int(w.max())
        if lo == hi:                               # the usual batch: one window
            self._store(lo).append(ev, t)
        else:
            for win in np.unique(w).tolist():
                m = w == win
                self._store(win).append(ev[m], t[m])
        self._buffered += len(ev)
        self._newest_ns = max(self._newest_ns, int(t.max()))

    def _store(self, win: int) -> WindowColumns:
        store = self._open.get(win)
        if store is None:
            store = self._open[win] = self._pool.take()
        return store

    def _take_lost(self, win: int) -> tuple[dict[int, int], dict[int, int]]:
        """Window ``win``'s lost records (per communicator hash, per the whole node-window under key 0):
        the late / buffer-full drops since the last close and the notes attributed to it."""
        notes, refused = self.losses.take()
        open_w = [win, *sorted(self._open)]
        for w in open_w if refused else ():              # a note refused (ledger full): every open window
            self._lost_at.setdefault(w, LostRecords()).dropped_job(0, refused)
        for note in (n for n in notes if n.job_id == self.config.job_id):    # a node speaks for one job
            self.counters["waits_lossy_noted"] += note.n
            ws = note_windows(note, win, open_w, self._win_ns, NOTE_AHEAD_WINDOWS)
            for w in np.unique(ws).tolist():
                at = self._lost_at.setdefault(w, LostRecords())
                if note.events is None:                  # a jump: no communicator, the whole node-window
                    at.dropped_job(0, note.n)
                else:
                    comm = note.events["comm_hash"]
                    self.counters["waits_lossy_folded"] += at.dropped(0, comm[ws == w] if len(ws) == len(comm)
                                                                       else comm)
        comms, whole = self._lost.take()
        for mine, theirs in zip((comms, whole), self._lost_at.pop(win).take() if win in self._lost_at else ()):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self._lost_at = {k: v for k, v in self._lost_at.items() if k > win}
        return comms, whole

    def tick(self, *, flush_all: bool = False) -> int:
        """Close the ready windows (all with ``flush_all``), queue their partials, flush the outbox."""
        self.close_ready(flush_all=flush_all)
        return self.outbox.flush()

    def close_ready(self, *, flush_all: bool = False) -> int:
        """Close the ready windows and queue their partials (the service flushes the outbox itself)."""
        closed = 0
        for win in sorted(self._open):
            if not flush_all and (win + 1) * self._win_ns + self._late_ns > self._newest_ns:
                break
            self._close(win)
            closed += 1
        return closed

    def _close(self, win: int) -> None:
        store = self._open.pop(win)
        ev, n = store.columns(), store.n
        self._buffered -= n
        self._closed_upto = max(self._closed_upto, win + 1)
        cfg = self.config
        # the waits' lossy rule (collector/processors/wait.py): records lost while the window was open, per
        # communicator; those past the communicators tracked, against the node-window
        comms, whole = self._take_lost(win)
        p = node_partial(ev, node=cfg.node, job_id=cfg.job_id, window=win, window_s=cfg.window_s,
                         waits=cfg.wait_streams, max_wait_records=cfg.max_wait_records,
                         lossy=whole.get(0, 0) > LOSSY_SHARE * n, lossy_comms=lossy_comms(ev["comm_hash"], comms))
        if cfg.wait_streams:
            self.counters["waits_cut"] += p["waits_cut"]
            self.counters["waits_lossy_windows"] += p["waits_lossy"]
            self.counters["waits_lossy_comms"] += len(p["waits_lossy_comms"])
        self._pool.give(store)                     # the partial's frames hold copies, not these views
        # P > 1: every partition's partial, an empty one included (its merger then does not wait for us)
        pieces = [p] if cfg.partitions == 1 else split_partial(p, cfg.partitions)
        try:
            out = [(q, encode_messages(q, cfg.job_id, cfg.max_message_bytes, self._ratio, cfg.inputs_authenticated))
                   for q in pieces]
        except ValueError:       # over MAX_PARTS messages, or a value the wire cannot carry: lost, counted
            self.counters["dropped_unencodable"] += n
            return
        for q, msgs in out:
            part = q.get("partition")
            for i, data in enumerate(msgs):
                mid = msg_id(unit(cfg.job_id, part), cfg.node, win, i, len(msgs))
                self.outbox.offer(Message(subject(cfg.job_id, cfg.node, part), data, mid))
            self.counters["split_partials"] += len(msgs) > 1
        self._ratio = sum(len(m) for _, msgs in out for m in msgs) / max(raw_size(p), 1)   # next window's guess
        self.counters["aggregated"] += n
        self.counters["windows"] += 1


def registry(node: NodeCollector):
    """A prometheus-client registry exposing the node's counters (served by the CLI's /metrics)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Node:
        def collect(self):
            c = dict(node.counters)
            fam = CounterMetricFamily("dynamiccl_node_records", "records by outcome", labels=["outcome"])
            for k in ("received", "aggregated", "dropped_invalid", "dropped_late", "dropped_buffer_full",
                      "dropped_unencodable"):
                fam.add_metric([k], c[k])
            yield fam
            yield CounterMetricFamily("dynamiccl_node_windows", "windows closed", value=c["windows"])
            waits = CounterMetricFamily("dynamiccl_node_waits", "--wait-streams: untimed collective records not "
                                        "sent (cut: over max_wait_records), windows whose waits the merger "
                                        "withholds (lossy_windows), communicators of a window whose waits it "
                                        "withholds (lossy_comms), records dropped while a window was open "
                                        "counted against the whole window past 4096 communicators "
                                        "(lossy_folded), records lost before the node (queue full, flood, "
                                        "record_seq jumps) fed to the lossy rule (lossy_noted)",
                                        labels=["outcome"])
            for k in ("cut", "lossy_windows", "lossy_comms", "lossy_folded", "lossy_noted"):
                waits.add_metric([k], c[f"waits_{k}"])
            yield waits
            yield CounterMetricFamily("dynamiccl_node_split_partials", "partials sent in several messages",
                                      value=c["split_partials"])
            out = CounterMetricFamily("dynamiccl_node_partials", "partials by outcome", labels=["outcome"])
            for k in ("emitted", "dropped", "send_errors"):
                out.add_metric([k], node.outbox.counters[k])
            yield out
            yield CounterMetricFamily("dynamiccl_node_upstream_bytes", "bytes sent upstream",
                                      value=node.outbox.counters["bytes_emitted"])
            refused = CounterMetricFamily("dynamiccl_node_bus_refusals", "the NATS server refused this node "
                                          "(scaleout/auth.py)", labels=["why"])
            for k in ("auth_refused", "publish_refused", "subscribe_refused"):
                refused.add_metric([k], c.get(k, 0))
            yield refused
            if "tuner_version" in c:      # --tuner-config: the job's tuner file from the bus (scaleout/tuner_bus.py)
                tuner = CounterMetricFamily("dynamiccl_node_tuner_configs", "tuner files received from the bus, "
                                            "by outcome (refused_<reason>: not written)", labels=["outcome"])
                for k, v in sorted(c.items()):
                    if k.startswith("tuner_") and k != "tuner_version":
                        tuner.add_metric([k[len("tuner_"):]], v)
                yield tuner
                yield GaugeMetricFamily("dynamiccl_node_tuner_version", "tuner config version written",
                                        value=c["tuner_version"])

    reg = CollectorRegistry()
    reg.register(_Node())
    return reg
