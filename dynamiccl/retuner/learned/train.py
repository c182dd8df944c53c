"""Training of the learned policy in the simulator (harness layer: it drives the simulator's performance model).

Every sample is one decision: a communicator shape on a training topology, a collective and size, an incumbent
(NCCL's choice or the baseline's best action), a regime (network state) and the measured history leading to it.
The simulator gives every action's noise-free time in that regime (the same decision the engine derives:
channels from the action or NCCL's count, chunk from NCCL's ``calcCollChunking``), so the action values are
fitted on full counterfactuals: the net predicts every action's log(time / incumbent's time) and the policy's
value is the design's reward of that prediction (:mod:`.reward`). Curriculum: stage 0 = one node (NVLink only,
start-up), stage 1 = + multi-node bandwidth and latency regimes, stage 2 = + incast, one degraded node,
stragglers, flapping histories. Seeded; held-out topologies and seeds (heldout/families.yaml) are refused.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from dynamiccl.harness.simulator.cost_model import ALGOS, PROTOS, NcclModel
from dynamiccl.harness.simulator.perf_model import NetworkState, expected_time
from dynamiccl.harness.simulator.topology import preset
from dynamiccl.retuner.learned.actions import CELLS, GRID, GRID_CHUNK, Grid, chunk_of
from dynamiccl.retuner.learned.policy import WEIGHT_KEYS, LearnedPolicy
from dynamiccl.retuner.learned.state import Decision, encode
from dynamiccl.retuner.model import CommModel, sub_topology

__all__ = ["TrainConfig", "TRAIN_TOPOLOGIES", "HELDOUT", "sample", "dataset", "train"]

HELDOUT = Path(__file__).resolve().parent / "heldout" / "families.yaml"
TRAIN_TOPOLOGIES = {0: ("h100-1x8", "h800-1x8", "a100-1x8"),
                    1: ("h100-2x8", "h100-4x8", "a100-2x8", "h100-2x1-roce"),
                    2: ("h100-5x8-roce", "p5en-2x8")}
FUNCS = ("AllReduce", "AllReduce", "AllReduce", "AllGather", "ReduceScatter")


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    samples: tuple[int, int, int] = (1000, 3000, 4000)    # per curriculum stage
    epochs: tuple[int, int, int] = (30, 40, 60)
    hidden: int = 32
    lr: float = 3e-3
    val_share: float = 0.2
    chunk_choices: bool = False                            # the action grid with chunk choices (actions.GRID_CHUNK)

    @property
    def grid(self) -> Grid:
        return GRID_CHUNK if self.chunk_choices else GRID

    def validate(self) -> "TrainConfig":
        held = set(yaml.safe_load(HELDOUT.read_text())["held_out_seeds"])
        if self.seed in held:
            raise ValueError(f"train: seed {self.seed} is a held-out seed ({sorted(held)})")
        if len(self.samples) != 3 or len(self.epochs) != 3 or min(self.samples) < 1 or min(self.epochs) < 1:
            raise ValueError("train: samples and epochs need three positive counts (one per curriculum stage)")
        if not 0.0 < self.val_share < 0.5:
            raise ValueError("train: val_share must be in (0, 0.5)")
        return self


def _check_topologies() -> None:
    held = set(yaml.safe_load(HELDOUT.read_text())["held_out_topologies"])
    bad = held.intersection(t for ts in TRAIN_TOPOLOGIES.values() for t in ts)
    if bad:
        raise ValueError(f"train: held-out topologies in the training set: {sorted(bad)}")


def _regime(rng: np.random.Generator, stage: int, nnodes: int, nranks: int):
    """(kind, NetworkState, flapping) of one sampled regime."""
    if stage == 0 or nnodes == 1:
        return "start", NetworkState(noise_sigma=0.0), False
    kinds = ["bandwidth", "latency"] + (["incast", "node", "straggler"] if stage == 2 else [])
    k = kinds[rng.integers(len(kinds))]
    flap = stage == 2 and rng.random() < 0.25
    if k == "bandwidth":
        return k, NetworkState(link_bw_factor=float(rng.uniform(0.2, 0.9)), noise_sigma=0.0), flap
    if k == "latency":
        return k, NetworkState(added_latency_us=float(rng.uniform(10, 250)), noise_sigma=0.0), flap
    if k == "incast":
        return "bandwidth", NetworkState(competing_share=float(rng.uniform(0.1, 0.8)), noise_sigma=0.0), flap
    if k == "node":
        bw = [1.0] * nnodes
        bw[rng.integers(nnodes)] = float(rng.uniform(0.2, 0.8))
        return "bandwidth", NetworkState(link_bw_factor=tuple(bw), noise_sigma=0.0), flap
    sl = [1.0] * nranks
    sl[rng.integers(nranks)] = float(rng.uniform(1.1, 2.0))
    return "other", NetworkState(rank_slowdown=tuple(sl), noise_sigma=0.0), flap


def _times(cm: CommModel, nm: NcclModel, sub, func: str, nbytes: int, state: NetworkState,
           grid: Grid = GRID) -> np.ndarray:
    """Noise-free time (µs) of every action under ``state``; inf where the cell is not enabled or the chunk choice
    is masked (below the protocol's grain)."""
    out = np.full(grid.n, np.inf)
    enabled = set(cm.cells(func, nbytes))
    acts = [(f, k) for f in grid.ch_factors for k in grid.ck_factors]
    nb = np.array([nbytes] * len(acts))
    for ci, cell in enumerate(CELLS):
        if cell not in enabled:
            continue
        a, p = ALGOS.index(cell[0]), PROTOS.index(cell[1])
        d = cm.default_channels(func, nbytes, cell)
        lim = cm.channel_limit(cell)
        ch = np.array([d if f == 0 else int(max(1, min(lim, round(d * f)))) for f, _ in acts])
        ck = nm.chunk_size(func, a, p, nb, ch)
        mine = [chunk_of(cell[1], c, k) for c, (_, k) in zip(ck, acts)]
        ok = np.array([m is not None for m in mine])
        ck = np.array([c if not m else m for c, m in zip(ck, mine)], dtype=np.float64)
        t = expected_time(sub, func, nb, a, p, ch, ck, state)
        out[ci * grid.per_cell:(ci + 1) * grid.per_cell] = np.where(ok, t, np.inf)
    return out


def sample(rng: np.random.Generator, stage: int, cache: dict, grid: Grid = GRID) -> tuple[Decision, np.ndarray]:
    """One decision and the true log(time / incumbent's time) of every action (nan where masked)."""
    while True:
        name = TRAIN_TOPOLOGIES[min(stage, 2)][rng.integers(len(TRAIN_TOPOLOGIES[min(stage, 2)]))] if stage < 2 else \
            [t for ts in TRAIN_TOPOLOGIES.values() for t in ts][rng.integers(9)]
        topo = preset(name)
        nnodes = 1 if stage == 0 else int(rng.choice([1, topo.n_nodes, topo.n_nodes]))
        nranks = nnodes * topo.gpus_per_node
        if nranks >= 2:
            break
    key = (name, nnodes, nranks)
    if key not in cache:
        sub = sub_topology(topo, nnodes, nranks)
        cache[key] = (CommModel(topo, nnodes=nnodes, nranks=nranks), NcclModel(sub), sub)
    cm, nm, sub = cache[key]
    func = FUNCS[rng.integers(len(FUNCS))]
    bucket = int(rng.integers(12, 28))
    nbytes = int((1 << bucket) * 1.41) * (nranks if func in ("AllGather", "ReduceScatter") else 1)
    kind, st, flap = _regime(rng, stage, nnodes, nranks)
    t0 = _times(cm, nm, sub, func, nbytes, NetworkState(noise_sigma=0.0), grid)
    t1 = _times(cm, nm, sub, func, nbytes, st, grid) if kind != "start" else t0
    dcell = cm.default_cell(func, nbytes)
    inc = grid.index(dcell) if rng.random() < 0.5 or kind == "start" else int(np.argmin(t0))
    inc_cell = grid.action_of(inc)[0]
    inc_ch = cm.default_channels(func, nbytes, inc_cell)
    noise = lambda: float(rng.normal(0, 0.02))  # noqa: E731
    ratio = float(t1[inc] / t0[inc]) * math.exp(noise())
    pre = [(noise(), 0.02, 0.0) for _ in range(int(rng.integers(2, 9)))]
    post = [((math.log(ratio) if (not flap or j % 2 == 0) else 0.0) + noise(), 0.02, 0.0)
            for j in range(int(rng.integers(1, 5)))]
    fit = cm.refit(kind, func, nbytes, inc_cell, ratio) if kind in ("bandwidth", "latency") else None
    tab = cm.table(func, nbytes, fit) if fit is not None else cm.table(func, nbytes)
    a0, p0 = ALGOS.index(inc_cell[0]), PROTOS.index(inc_cell[1])
    rel = {c: float(tab[ALGOS.index(c[0]), PROTOS.index(c[1])] / tab[a0, p0]) for c in cm.cells(func, nbytes)}
    d = Decision(func, bucket, nranks, nnodes, kind, inc_cell, inc_ch, ratio if kind != "start" else 1.0,
                 frozenset(cm.cells(func, nbytes)), rel, tuple(pre + post))
    y = np.where(np.isfinite(t1), np.log(t1 / t1[inc]), np.nan)
    return d, y


def dataset(n: int, stage: int, seed: int, grid: Grid = GRID) -> tuple[list[Decision], np.ndarray]:
    rng = np.random.default_rng([seed, stage])
    cache: dict = {}
    ds, ys = [], []
    for _ in range(n):
        d, y = sample(rng, stage, cache, grid)
        ds.append(d)
        ys.append(y)
    return ds, np.asarray(ys)


def _regret(pol: LearnedPolicy, ds: list[Decision], ys: np.ndarray) -> tuple[float, float]:
    """Mean (time of the chosen action / the best action's time − 1) of the policy and of the refitted model's top cell."""
    r_pol, r_mod = [], []
    for d, y in zip(ds, ys):
        best = np.nanmin(y)
        a = next(r.action for r in pol.rank(d) if np.isfinite(y[r.action]))   # skip chunk choices masked here
        r_pol.append(math.exp(y[a] - best) - 1)
        mc = min(d.enabled, key=lambda c: d.model_rel.get(c, math.inf))
        r_mod.append(math.exp(y[pol.grid.index(mc)] - best) - 1)
    return float(np.mean(r_pol)), float(np.mean(r_mod))


def train(cfg: TrainConfig, out: str | Path, *, log=print) -> dict:
    """Train through the curriculum and write the weights (numpy ``.npz``, atomically). Returns the report."""
    import torch
    cfg = cfg.validate()
    _check_topologies()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    net = _Net(cfg.hidden, cfg.grid.n)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    val_d, val_y, report = [], [], {"stages": []}
    train_sets: list = []
    for stage in range(3):
        ds, ys = dataset(cfg.samples[stage], stage, cfg.seed, cfg.grid)
        nv = max(1, int(len(ds) * cfg.val_share))
        val_d += ds[:nv]
        val_y.append(ys[:nv])
        train_sets.append((ds[nv:], ys[nv:]))
        xs, ss, yy = _tensors(sum((list(d) for d, _ in train_sets), []), np.concatenate([y for _, y in train_sets]))
        loss = _fit(net, opt, xs, ss, yy, cfg.epochs[stage], cfg.seed + stage)
        report["stages"].append({"stage": stage, "samples": int(len(yy)), "loss": loss})
        log(f"stage {stage}: {len(yy)} training samples, loss {loss:.4f}, {time.perf_counter() - t_start:.0f} s")
    w = net.export()
    pol = LearnedPolicy(w)
    vy = np.concatenate(val_y)
    report["val_regret"], report["val_model_regret"] = _regret(pol, val_d, vy)
    report["val_samples"] = len(val_d)
    report["train_s"] = time.perf_counter() - t_start
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    # the chunk flag only when set, so the default grid's file stays byte-identical to the shipped one
    extra = {"meta_chunk_choices": str(cfg.chunk_choices)} if cfg.chunk_choices else {}
    np.savez_compressed(tmp, **w, meta_seed=str(cfg.seed), meta_samples=str(cfg.samples), meta_epochs=str(cfg.epochs),
                        **extra)
    tmp.replace(out)
    return report


def _tensors(ds: list[Decision], ys: np.ndarray):
    import torch
    enc = [encode(d) for d in ds]
    xs = torch.tensor(np.stack([e[0] for e in enc]))
    ss = torch.tensor(np.stack([e[1] for e in enc]))
    return xs, ss, torch.tensor(np.clip(ys, -3, 3), dtype=torch.float32)


def _fit(net, opt, xs, ss, yy, epochs: int, seed: int, batch: int = 128) -> float:
    import torch
    g = torch.Generator().manual_seed(seed)
    mask = ~torch.isnan(yy)
    y0 = torch.nan_to_num(yy)
    last = math.nan
    for _ in range(epochs):
        perm = torch.randperm(len(yy), generator=g)
        tot, n = 0.0, 0
        for i in range(0, len(perm), batch):
            b = perm[i:i + batch]
            p = net(xs[b], ss[b])
            m = mask[b]
            # actions near the best matter most for the choice: weight errors on fast actions up
            wgt = m * (1.0 + 2.0 * (y0[b] < 0.05))
            loss = ((p - y0[b]) ** 2 * wgt).sum() / wgt.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += loss.item() * len(b)
            n += len(b)
        last = tot / max(n, 1)
    return last


def _Net(hidden: int, n_actions: int = GRID.n):
    import torch
    from torch import nn
    from dynamiccl.retuner.learned.state import N_SEQ_FEATS, N_STATIC

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(N_SEQ_FEATS, hidden, batch_first=True)
            self.l1, self.l2, self.l3 = nn.Linear(N_STATIC + hidden, 64), nn.Linear(64, 64), nn.Linear(64, n_actions)

        def forward(self, x, s):
            # padding rows (all zero) are skipped by numpy inference; here they run through the LSTM with zero
            # input, so pack the real suffix instead
            lens = (s.abs().sum(-1) > 0).sum(-1).clamp(min=1)
            s2 = torch.stack([torch.roll(si, int(li), 0) for si, li in zip(s, lens)])   # real rows first
            packed = nn.utils.rnn.pack_padded_sequence(s2, lens.cpu(), batch_first=True, enforce_sorted=False)
            _, (h, _) = self.lstm(packed)
            z = torch.cat([x, h[-1]], -1)
            return self.l3(torch.relu(self.l2(torch.relu(self.l1(z)))))

        def export(self) -> dict:
            sd = {k: v.detach().numpy().astype(np.float32) for k, v in self.state_dict().items()}
            w = {"w_ih": sd["lstm.weight_ih_l0"], "w_hh": sd["lstm.weight_hh_l0"],
                 "b": sd["lstm.bias_ih_l0"] + sd["lstm.bias_hh_l0"],
                 "w1": sd["l1.weight"], "b1": sd["l1.bias"], "w2": sd["l2.weight"], "b2": sd["l2.bias"],
                 "w3": sd["l3.weight"], "b3": sd["l3.bias"]}
            assert set(w) == set(WEIGHT_KEYS)
            return w

    return Net()
