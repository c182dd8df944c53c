"""A tiny synthetic job for retuner tests: known costs per (regime, config), configs applied through the real
file path (the retuner writes the tuner config, a FileTuner reloads it at every step and applies it with the
plugin's reference semantics to a fake NCCL cost table), seeded noise, one observation per target per step."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dynamiccl.nccl_tuner_plugin.config import ALGOS, PROTOS
from dynamiccl.harness.retuner_eval.sim_tuner import FileTuner
from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig
from dynamiccl.retuner.types import Observation, Target

DEFAULT_CELL = ("RING", "SIMPLE")


@dataclass
class Comm:
    comm_hash: int
    name: str


@dataclass
class FakeJob:
    """``cost(regime, algo, proto, channels) -> seconds``; ``disabled`` cells are −1 in NCCL's table."""
    path: str
    targets: list[Target]
    cost: callable
    regime: str = "base"
    seed: int = 0
    n_per_step: int = 64
    step_s: float = 0.25
    sigma: float = 0.02
    disabled: tuple = ()
    t: float = 0.0
    tuner: FileTuner = None
    ran: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.tuner = FileTuner(self.path)

    def table(self) -> np.ndarray:
        t = np.full((7, 3), -1.0)
        for a in ("TREE", "RING"):
            for p in PROTOS:
                if (a, p) not in self.disabled:
                    t[ALGOS.index(a), PROTOS.index(p)] = 100.0
        t[ALGOS.index(DEFAULT_CELL[0]), PROTOS.index(DEFAULT_CELL[1])] = 50.0    # NCCL's choice
        return t

    def step(self) -> list[Observation]:
        version = self.tuner.refresh()
        out = []
        for tg in self.targets:
            nbytes = tg.byte_range()[0]
            table, nch = self.tuner.get_coll_info(Comm(tg.comm_hash, tg.comm_name), tg.func, nbytes, self.table())
            flat = np.where(table >= 0, table, np.inf)
            a, p = np.unravel_index(int(np.argmin(flat)), flat.shape)
            algo, proto = ALGOS[a], PROTOS[p]
            mean = self.cost(self.regime, algo, proto, nch)
            x = mean * self.rng.lognormal(0.0, self.sigma, self.n_per_step)
            self.ran.append((self.t, tg.key, algo, proto, nch, version))
            out.append(Observation(tg, self.t, self.t + self.step_s, self.n_per_step, float(x.mean()),
                                   float(x.var(ddof=1)), algo, proto, nch or None, version=version))
        self.t += self.step_s
        return out


def simple_cost(fast_in: dict[str, tuple[str, str, int]], base: float = 1e-3, gain: float = 1.3):
    """Every config costs ``base`` x regime factor, except the regime's fast config (``gain`` x faster)."""
    factor = {"base": 1.0, "slow": 2.0, "slow2": 3.0}

    def cost(regime: str, algo: str, proto: str, nch: int) -> float:
        f = factor.get(regime, 1.0) * base
        fa = fast_in.get(regime)
        if fa is not None and (algo, proto) == fa[:2] and (fa[2] == 0 or nch == fa[2]):
            return f / gain
        if (algo, proto) == DEFAULT_CELL:
            return f
        return f * 1.15
    return cost


def rc(id_: str, kind: str, t: float, *, magnitude: float = 2.0, comms=("0x1f",), recovers=None):
    from dynamiccl.detector.events import RegimeChange
    return RegimeChange(id=id_, kind=kind, job_id="job", start_s=t - 1.0, detected_s=t, magnitude=magnitude,
                        comms=list(comms), comm_names=["dp0"], recovers=recovers)


def target(h: int = 0x1f, bucket: int = 24) -> Target:
    return Target(h, "AllReduce", bucket, nranks=2, nnodes=2, comm_name=f"c{h:x}")


def make(tmp_path, *, dry_run=False, policy=None, **kw) -> Retuner:
    pol = policy or PolicyConfig(tune_at_start=False)
    cfg = RetunerConfig(dry_run=dry_run, tuner_config_path=str(tmp_path / "tuner.conf"),
                        audit_path=str(tmp_path / "audit.jsonl"), policy=pol, **kw)
    return Retuner(cfg, clock=lambda: 1000.0)


def run(rt: Retuner, job: FakeJob, steps: int, events: dict[int, object] = {}) -> None:
    for i in range(steps):
        rt.observe(job.step())
        if i in events:
            ev = events[i]
            if isinstance(ev, str):
                job.regime = ev
            else:
                rt.on_change(ev)


def actions(rt: Retuner) -> list[str]:
    """Decisions (the audit log also records every push)."""
    return [a["action"] for a in rt.audit.recent if a["action"] != "push"]


def running(job: FakeJob, last: int = 1) -> list[tuple[str, str]]:
    return [(r[2], r[3]) for r in job.ran[-last:]]
