"""Cross-rank consistency: with the agreement hook, late or lost config deliveries never make the ranks of a
communicator use different configurations for the same collective.

A simulated 16-rank job (the ``small`` workload: TP=8 x2, DP=2 x8, world, pipeline pairs) runs in the
engine with every rank's decisions taken from its OWN instance of the real plugin (a private copy of the
.so, its own config file, no reload thread). At every step boundary a retuner writes a new version (random
rules for the workload's collectives, the newest 8 kept); a distributor copies the file to each rank, but a
random rank's copy is delayed by 1-6 steps or dropped, and late copies may arrive after newer ones. Each rank
re-reads its file, then the agreement hook runs over all ranks (``dynamiccl.nccl_tuner_plugin.sync.run_ranks``: the
hook's real code with an in-memory MIN all-reduce). For every collective every member rank's plugin is asked;
a *mismatch* is a collective on which two ranks would run different (algo, proto, channels, chunk).

The same deliveries without the hook (each rank applies what it has: ``immediate`` mode) produce mismatches,
so the check can fail.
"""
from __future__ import annotations

import random
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from dynamiccl.nccl_tuner_plugin import sync
from dynamiccl.nccl_tuner_plugin.config import ALGOS, MAX_VERSIONS, PROTOS, Rule, TunerConfig, format_configs
from dynamiccl.harness.retuner_eval.sim_tuner import distribute
from dynamiccl.harness.simulator.engine import Engine
from dynamiccl.harness.simulator.tuner_abi import RankTuners
from dynamiccl.harness.simulator.workload import preset

TUNED = [("AllReduce", 1 << 20), ("AllReduce", 4 << 20), ("AllReduce", 8), ("AllGather", 65536),
         ("ReduceScatter", 1 << 20)]


class Scenario:
    """Retuner + lossy distributor + per-step reload and agreement, as the engine's step hook."""

    def __init__(self, tmp: Path, wl, seed: int, *, agree: bool, p_fault: float = 0.5, p_drop: float = 0.4):
        self.rng = random.Random(seed)
        self.tmp = tmp
        self.comms = [c.comm_hash for c in wl.comms]
        self.agree = agree
        self.p_fault, self.p_drop = p_fault, p_drop
        self.history: list[TunerConfig] = []
        self.pending: list[tuple[int, int, Path]] = []     # (due step, rank, snapshot)
        self.delivered: dict[int, Path] = {}                # newest snapshot each rank has received
        self.switches = 0
        self.faults = {"delayed": 0, "dropped": 0, "out_of_order": 0}
        self.lagging_steps = 0          # steps where some rank had not staged the newest version
        self.last_applied: int | None = None
        self.step = 0

    def new_version(self) -> TunerConfig:
        v = self.history[-1].version + 1 if self.history else 1
        rules = []
        for func, nbytes in TUNED:
            if self.rng.random() < 0.8:
                comm = self.rng.choice((None, None, *self.comms))
                rules.append(Rule(func, nbytes, nbytes, self.rng.choice(ALGOS[:2]), self.rng.choice(PROTOS),
                                  self.rng.choice((0, 2, 4, 8, 16)), self.rng.choice((0, 0, 65536, 131072)), comm))
        return TunerConfig(v, tuple(rules))

    def __call__(self, rt: RankTuners, step: int) -> None:
        self.step = step
        # 1. the retuner pushes a new version (whole file, newest MAX_VERSIONS kept, atomic write)
        self.history = (self.history + [self.new_version()])[-MAX_VERSIONS:]
        snap = self.tmp / f"v{self.history[-1].version:06d}.conf"
        snap.write_text(format_configs(self.history))     # a snapshot for the distributor (no fsync needed)
        # 2. the distributor: a random rank's copy is delayed or dropped
        self.pending += distribute(self.rng, rt.n_ranks, step, snap, p_fault=self.p_fault, p_drop=self.p_drop,
                                   max_delay=6, faults=self.faults)
        due = sorted((p for p in self.pending if p[0] <= step), key=lambda p: p[0])
        self.pending = [p for p in self.pending if p[0] > step]
        for _, r, path in due:      # in due order: a late old copy can land after a newer one
            if r in self.delivered and path < self.delivered[r]:
                self.faults["out_of_order"] += 1
            rt.deliver(r, path)
            self.delivered[r] = max(path, self.delivered.get(r, path))
        # 3. every rank re-reads its file (an older file than what it has is rejected: last good kept)
        rt.reload()
        staged = [p.staged_version for p in rt.plugins]
        self.lagging_steps += min(staged) < self.history[-1].version
        # 4. the agreement hook at the step boundary (all ranks)
        if self.agree:
            applied = sync.run_ranks(rt.plugins)
            assert len(set(applied)) == 1, applied
        applied_now = rt.applied_versions()
        if self.last_applied is not None and applied_now[0] != self.last_applied:
            self.switches += 1
        self.last_applied = applied_now[0]


@pytest.fixture
def tmp_path(tmp_path):
    """Rank files on tmpfs when there is one: ~2,000 renames per 100 steps, slow on overlay file systems."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="dccl-consistency-", dir="/dev/shm"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run(tmp_path: Path, switches: int, *, agree: bool, seed: int = 1, max_steps: int | None = None) -> dict:
    wl = preset("small")
    sc = Scenario(tmp_path / "snapshots", wl, seed, agree=agree)
    (tmp_path / "snapshots").mkdir()
    t0 = time.perf_counter()
    with RankTuners(wl.topology.n_ranks, tmp_path / "ranks", mode="agree" if agree else "immediate",
                    step_hook=sc) as rt:
        eng = Engine(wl, seed=seed, tuner=rt, duration_s=1e9)
        steps = 0
        while sc.switches < switches and (max_steps is None or steps < max_steps):
            eng.step()
            steps += 1
        out = {"switches": sc.switches, "steps": steps, "mismatches": rt.mismatches, "decisions": rt.decisions,
               "examples": rt.mismatch_examples[:3], "faults": dict(sc.faults), "lagging_steps": sc.lagging_steps,
               "reload_errors": sum(p.stats()["reload_errors"] for p in rt.plugins),
               "seconds": time.perf_counter() - t0}
    shutil.rmtree(tmp_path / "snapshots", ignore_errors=True)
    return out


def _check(res: dict, switches: int) -> None:
    assert res["switches"] >= switches, res
    assert res["faults"]["delayed"] > switches // 10 and res["faults"]["dropped"] > switches // 20, res
    assert res["lagging_steps"] > switches // 10, res        # the hook really had to wait for laggards
    assert res["faults"]["out_of_order"] > 0 and res["reload_errors"] > 0, res   # stale copies were rejected
    assert res["mismatches"] == 0, res


def test_agreement_no_mismatch_100_switches(tmp_path):
    res = run(tmp_path, 100, agree=True)
    print(res)
    _check(res, 100)


@pytest.mark.slow
def test_agreement_no_mismatch_1000_switches(tmp_path):
    res = run(tmp_path, 1000, agree=True, seed=2)
    print(res)
    _check(res, 1000)


def test_without_the_hook_the_same_faults_cause_mismatches(tmp_path):
    """Negative control: each rank applies whatever it has (immediate mode) -> ranks disagree."""
    res = run(tmp_path, 60, agree=False, max_steps=200)
    print(res)
    assert res["mismatches"] > 0, res
    ex = res["examples"][0]
    assert len(set(ex["applied"].values())) > 1, ex     # the disagreeing ranks had different versions


def test_agree_never_reverts_to_nccl_defaults_when_a_rank_lacks_the_file():
    """Issue 18 #8: a rank whose file was empty or torn (staged 0, or older) took the MIN to 0 and agree()
    then reverted every rank to NCCL's defaults; now every rank keeps the applied version."""
    class Rank:
        def __init__(self, staged: int) -> None:
            self.staged_version, self.applied_version = staged, 0

        def prepare_version(self, v: int) -> bool:
            return v <= self.staged_version

        def apply_version(self, v: int) -> None:
            self.applied_version = v

    ranks = [Rank(5), Rank(5), Rank(5)]
    assert sync.run_ranks(ranks) == [5, 5, 5]
    ranks[1].staged_version = 0          # its reload refused an empty/torn file: nothing staged
    assert sync.run_ranks(ranks) == [5, 5, 5]
    ranks[1].staged_version = 3          # an older version only
    assert sync.run_ranks(ranks) == [5, 5, 5]
    for r in ranks:
        r.staged_version = 6
    assert sync.run_ranks(ranks) == [6, 6, 6]   # forward still works
