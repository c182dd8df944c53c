"""Seeded, randomised, labelled test-bed scenarios, and the recorder of the corpus built from them.

``generate(seed)`` draws one :class:`~dynamiccl.harness.testbed.scenario.Scenario`:

* the job: 2–4 ranks, a base link rate, 2–6 gradient buckets of mixed sizes (4 KiB–1 MiB), a
  compute gap per step (mostly 5–80 ms, one run in five a sparse job with 0.5–2 s steps), a batch
  loaded from the data node;
* a timeline of changes ``gap_s`` apart (10–60 s in the issue; :data:`DEFAULT_GAP_S` keeps a run
  short enough to record many on one machine): a throttle of one rank, a pair of ranks (a node's
  worth of links) or every rank, on ingress, egress or both; a deeper or softer step of what is
  throttled; its release; competing bulk traffic into one rank, on and off.

Every action is one labelled change (``truth.json``: onset, kind, where, direction, magnitude).
The draw is a pure function of the seed (``random.Random(seed)``), so the corpus is reproducible
and its development / evaluation split is by seed: :func:`split` (even seeds develop, odd seeds
evaluate), fixed before any run was looked at.

Record: ``python -m dynamiccl.harness.testbed.generate record --seeds 0-39 --out corpus/runs``
(root, iproute2; one run at a time, runs already recorded are skipped).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

from dynamiccl.harness.testbed.scenario import MIN_CHANGE, Action, Scenario

__all__ = ["generate", "split", "parse_seeds", "record_seeds", "DEFAULT_GAP_S", "main"]

DEFAULT_GAP_S = (10.0, 20.0)
BUCKET_SIZES = ("4k", "16k", "64k", "128k", "256k", "512k", "1m")
DIRECTIONS = ("both", "ingress", "egress")


def split(seed: int) -> str:
    """The corpus half a seed belongs to: ``dev`` (even) or ``eval`` (odd)."""
    return "dev" if seed % 2 == 0 else "eval"


def parse_seeds(text: str) -> list[int]:
    """``"0-3,7"`` → ``[0, 1, 2, 3, 7]``.

    >>> parse_seeds("0-3,7")
    [0, 1, 2, 3, 7]
    """
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


class _Timeline:
    """Draws actions that keep the scenario valid: what is throttled, at what rate, where bulk runs."""

    def __init__(self, rng: random.Random, nranks: int, base: float):
        self.rng, self.nranks, self.base = rng, nranks, base
        self.throttled: tuple[tuple[int, ...] | None, str, float] | None = None  # (ranks, direction, mbit)
        self.bulk: int | None = None

    def _rate(self, deeper_than: float | None = None) -> float:
        lo, hi = 0.15, 1 - MIN_CHANGE - 0.05
        mbit = round(self.base * self.rng.uniform(lo, hi), 1)
        if deeper_than is not None and abs(mbit - deeper_than) / max(mbit, deeper_than) < MIN_CHANGE:
            # a step must move the capacity by >= MIN_CHANGE too: go the other way, far enough
            mbit = round(deeper_than * 0.5 if deeper_than > self.base * 0.3 else min(deeper_than * 2.0,
                                                                                    self.base * 0.65), 1)
        return mbit

    def _where(self) -> tuple[int, ...] | None:
        kind = self.rng.choices(("rank", "pair", "all"), weights=(0.65, 0.15, 0.2))[0]
        if kind == "rank" or self.nranks < 3:
            return (self.rng.randrange(self.nranks),) if kind != "all" else None
        if kind == "pair":
            return tuple(sorted(self.rng.sample(range(self.nranks), 2)))
        return None

    def next(self, at: float) -> Action:
        rng = self.rng
        if self.throttled is not None:
            ranks, direction, mbit = self.throttled
            if rng.random() < 0.3:  # a deeper or softer step of the same throttle
                new = self._rate(deeper_than=mbit)
                self.throttled = (ranks, direction, new)
                return Action(at, "throttle", ranks, new, direction)
            self.throttled = None
            return Action(at, "release", ranks)
        if self.bulk is not None:
            r, self.bulk = self.bulk, None
            return Action(at, "bulk_off", (r,))
        if rng.random() < 0.2:
            self.bulk = rng.randrange(self.nranks)
            return Action(at, "bulk_on", (self.bulk,))
        ranks, direction = self._where(), rng.choice(DIRECTIONS)
        mbit = self._rate()
        self.throttled = (ranks, direction, mbit)
        return Action(at, "throttle", ranks, mbit, direction)

    def close(self, at: float) -> list[Action]:
        """Undo what is still in place, so every run ends at its base state."""
        out = []
        if self.throttled is not None:
            out.append(Action(at, "release", self.throttled[0]))
        if self.bulk is not None:
            out.append(Action(at, "bulk_off", (self.bulk,)))
        return out


def generate(seed: int, *, changes: int = 10, gap_s: tuple[float, float] = DEFAULT_GAP_S,
             max_ranks: int = 4) -> Scenario:
    """One randomised, labelled scenario; the same seed gives the same scenario."""
    rng = random.Random(seed)
    nranks = rng.randint(2, max_ranks)
    base = float(rng.choice((40, 50, 60, 80)))
    sparse = rng.random() < 0.2
    compute_ms = rng.uniform(500, 2000) if sparse else rng.uniform(5, 80)
    buckets = ",".join(rng.choice(BUCKET_SIZES) for _ in range(rng.randint(2, 6)))
    tl = _Timeline(rng, nranks, base)
    actions, at = [], 0.0
    for _ in range(changes):
        actions.append(tl.next(round(at, 1)))
        at += rng.uniform(*gap_s)
    actions += tl.close(round(at, 1))
    return Scenario(f"gen{seed:03d}", nranks=nranks, base_mbit=base, buckets=buckets,
                    batch_bytes=rng.choice((64, 128, 256)) * 1024, compute_ms=round(compute_ms, 1),
                    actions=tuple(actions)).validate()


def record_seeds(seeds: list[int], out: Path, scenario_of: Callable[[int], Scenario], *, nice: int = 0,
                 prefix: str = "dtc", describe: Callable[[Scenario], str] = lambda sc: sc.name,
                 report: Callable[[Path, Any], str] = lambda d, res: res.score.line()) -> int:
    """The one recording loop of the test bed's seeded suites: each seed's scenario into
    ``out/seed-NNN`` (seeds already recorded are skipped; an unfinished run's folder is kept aside
    for its logs, never mixed into a new one). One failed run does not end the recording; a signal
    does. Returns the number of runs that failed."""
    from dynamiccl.harness.testbed.netns import new_prefix
    from dynamiccl.harness.testbed.run import run_scenario
    failed = 0
    for seed in seeds:
        d = out / f"seed-{seed:03d}"
        if (d / "summary.json").exists():
            continue
        if d.exists():
            d.rename(out / f"failed-{seed:03d}-{int(time.time())}")
        sc = scenario_of(seed)
        print(f"seed {seed} ({split(seed)}): {describe(sc)}", flush=True)
        try:
            res = run_scenario(sc, out_dir=d, live=False, nice=nice, print_fn=lambda *_: None,
                               prefix=new_prefix(prefix))
            if res.interrupted:
                print(f"seed {seed}: interrupted", file=sys.stderr, flush=True)
                return failed + 1
            print(f"seed {seed}: {report(d, res)}", flush=True)
        except Exception as exc:  # one failed run must not end the recording
            failed += 1
            print(f"seed {seed}: failed: {exc}", file=sys.stderr, flush=True)
    return failed


def record(seeds: list[int], out: Path, *, nice: int = 0) -> int:
    """Record the corpus runs of ``seeds`` into ``out/seed-NNN``."""
    return record_seeds(seeds, out, generate, nice=nice, prefix="dtc",
                        describe=lambda sc: f"{sc.nranks} ranks, {len(sc.actions)} changes, {sc.duration_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dynamiccl.harness.testbed.generate")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show", help="print the scenarios of some seeds")
    s.add_argument("--seeds", default="0-3")
    r = sub.add_parser("record", help="record the runs of some seeds (root)")
    r.add_argument("--seeds", default="0-39")
    r.add_argument("--out", default="corpus/runs")
    r.add_argument("--nice", type=int, default=0, help="priority increment of the test bed's processes")
    args = ap.parse_args(argv)
    if args.cmd == "show":
        for seed in parse_seeds(args.seeds):
            sc = generate(seed)
            print(f"seed {seed} ({split(seed)}) {sc.nranks} ranks base {sc.base_mbit:g} Mbit/s "
                  f"buckets {sc.buckets} compute {sc.compute_ms} ms, {sc.duration_s:.0f} s")
            for a in sc.actions:
                print(f"  {a.at_s:7.1f}s {a.describe(sc.base_mbit)}")
        return 0
    return 1 if record(parse_seeds(args.seeds), Path(args.out), nice=args.nice) else 0


if __name__ == "__main__":
    sys.exit(main())
