"""Plays a scenario's actions on the topology and writes the ground-truth timeline.

Each applied action becomes a :class:`TruthEvent` whose ``onset_wall`` is taken *before* the
first ``tc`` command (or when the bulk flow is connected), so measured detection delays are never
flattered. The timeline file is rewritten atomically after every action (another process can
read it live).
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from dynamiccl.harness.testbed.scenario import Action, Scenario
from dynamiccl.contracts.atomic import atomic_write

__all__ = ["TruthEvent", "Controller", "BulkClient", "write_json_atomic"]


def write_json_atomic(path: Path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1), fsync=False)


@dataclass
class TruthEvent:
    index: int
    do: str
    ranks: list[int]          # the ranks whose links changed
    all_ranks: bool
    degrades: bool            # throttle / bulk_on (else a recovery)
    at_s: float               # scheduled, seconds after the warm-up
    onset_wall: float         # epoch seconds, taken before the change was applied
    applied_wall: float       # epoch seconds, when it was in place
    mbit_from: float | None
    mbit_to: float | None
    description: str
    direction: str = "both"   # throttle: which way the links were shaped (a release restores both)

    @property
    def single_rank(self) -> int | None:
        return self.ranks[0] if len(self.ranks) == 1 and not self.all_ranks else None


class BulkClient:
    """Talks to ``python -m dynamiccl.harness.testbed.traffic bulk`` (started by the caller) over its stdin/stdout."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"bulk traffic helper did not start: {line!r}")

    def command(self, line: str, timeout: float = 10.0) -> float:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline().strip()), daemon=True)
        t.start()
        t.join(timeout)
        reply = out[0] if out else ""
        parts = reply.split()
        if len(parts) != 3 or parts[0] != "ok":
            raise RuntimeError(f"bulk traffic helper: {line!r} -> {reply or 'no answer'!r}")
        return float(parts[2])


class Controller:
    """Applies ``scenario.actions`` at ``t0_wall + at_s``; ``events`` is the truth so far."""

    def __init__(self, scenario: Scenario, topology, *, truth_path: Path,
                 bulk: BulkClient | None = None, bulk_target: Callable[[int], str] | None = None,
                 on_event: Callable[[TruthEvent], None] | None = None,
                 clock: Callable[[], float] = time.time):
        self.scenario = scenario
        self.topology = topology
        self.truth_path = Path(truth_path)
        self.bulk = bulk
        self.bulk_target = bulk_target
        self.on_event = on_event
        self._clock = clock
        self.events: list[TruthEvent] = []
        self.t0_wall: float | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, t0_wall: float) -> "Controller":
        self.t0_wall = t0_wall
        self._write()
        self._thread = threading.Thread(target=self._run, name="testbed-controller", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def _run(self) -> None:
        try:
            for i, action in enumerate(self.scenario.actions):
                due = self.t0_wall + action.at_s
                while not self._stop.is_set() and self._clock() < due:
                    self._stop.wait(min(0.05, max(0.0, due - self._clock())))
                if self._stop.is_set():
                    return
                ev = self.apply(i, action)
                self.events.append(ev)
                self._write()
                if self.on_event is not None:
                    self.on_event(ev)
        except BaseException as exc:  # reported by the runner
            self.error = exc

    def apply(self, i: int, a: Action) -> TruthEvent:
        s, topo = self.scenario, self.topology
        ranks = list(range(s.nranks)) if a.ranks is None else list(a.ranks)
        onset = self._clock()
        before = mbit_to = None
        if a.do in ("throttle", "release"):
            before = topo.rates[ranks[0]]
            mbit_to = a.mbit if a.do == "throttle" else s.base_mbit
            topo.set_rate(ranks, mbit_to, a.direction if a.do == "throttle" else "both")
            applied = self._clock()
        else:
            if self.bulk is None or self.bulk_target is None:
                raise RuntimeError("bulk traffic action without a bulk traffic helper")
            applied = onset
            for r in ranks:
                cmd = f"on r{r} {self.bulk_target(r)}" if a.do == "bulk_on" else f"off r{r}"
                applied = self.bulk.command(cmd)
            if a.do == "bulk_on":
                onset = applied  # the flow exists once it is connected
        # a softer step of a throttle (more capacity than before) is an improvement, not a degradation
        degrades = a.degrades if a.do != "throttle" or before is None else mbit_to < before
        return TruthEvent(index=i, do=a.do, ranks=ranks, all_ranks=a.ranks is None, degrades=degrades,
                          at_s=a.at_s, onset_wall=onset, applied_wall=applied, mbit_from=before,
                          mbit_to=mbit_to, description=a.describe(s.base_mbit),
                          direction=a.direction if a.do == "throttle" else "both")

    def truth(self) -> dict:
        return {"scenario": self.scenario.name, "base_mbit": self.scenario.base_mbit,
                "nranks": self.scenario.nranks, "t0_wall": self.t0_wall,
                "events": [asdict(e) for e in self.events]}

    def _write(self) -> None:
        write_json_atomic(self.truth_path, self.truth())
