"""The simulator's "reality": how long a collective takes on the current network state.

NCCL's model (:mod:`dynamiccl.harness.simulator.cost_model`) is an α–β fit with per-channel caps that it evaluates once at init.
This model is deliberately a *different*, more physical one, so that NCCL's default is sometimes wrong and
retuning can pay off (nccl-cost-model.md §3 "simulator recipe", §5):

* **Resources, not formulas.** Each algorithm moves a known number of bytes over each resource: the GPU's
  NVLink/PCIe egress and the node's NIC egress. The bandwidth term is the *slowest* resource (a max of stage
  times), so congestion only hurts an algorithm whose bottleneck is the network. This is what makes Ring lose
  −55 % but Tree only −25 % when a path degrades (nccl#319, §5.1): Tree was already bound elsewhere.
* **2-node Tree / NVLSTree send half the bytes over the network** (nccl#946, §4.1), which NCCL's model only
  approximates with ``bwIntra``.
* **Per-channel limits**: a channel (one CTA + one connection per peer) moves at most ``CH_CAP`` GB/s, at most
  ``chunk/γ`` (fixed per-chunk network cost, nccl#2409: 128 KiB chunks -> 13 GB/s) and at most its in-flight
  window ``NCCL_STEPS * step / RTT`` (latency-bandwidth product; nccl-tests#241). Channels and chunk are
  therefore real knobs, more so under added latency.
* **Competing traffic** shares a link per flow (ECMP/fair share): with ``s`` the share competitors hold against
  NCCL's reference 8 flows, ``nCh`` channels get ``nCh / (nCh + m)`` with ``m = 8 s / (1 - s)``, so more
  channels/QPs win back bandwidth (Meta +40 % with QP scaling, §0 point 7). Queueing adds ``s/(1-s)`` of the
  base network latency.
* **Stragglers**: a late rank delays everyone; every rank's measured duration runs from its own arrival to the
  common finish, so the straggler's own duration is the *shortest*.
* **LL across nodes is staged in host memory.** NCCL's net transport never puts LL buffers in GPU memory and
  its proxy checks every LL line's flag before it sends, so LL's multi-node throughput is a property of the
  host (CPU vendor), not of the NIC: a per-rank ceiling taken from NCCL's own CPU-vendor ``llMaxBw`` rows.
* **Pipeline fill per hop kind.** A Tree/NVLSTree chunk crosses ``2(ppn-1)`` NVLink hops and ``2 log2(N)``
  network hops; each fills at its own per-channel rate (NVLink hops forward LL/LL128 lines as they land, a
  network hop forwards a whole chunk because the proxy sends complete steps). Tree chains are rotations of each
  other (one head per NIC, NCCL search.cc), so while the pipeline fills a GPU forwards only the channels at its
  chain position, not all of them.
* **Latencies per (algo, proto).** Intra-node steps scale the link latency by NCCL's measured NVLink/PCI
  hwLat ratios; a network crossing is the one-way latency (+3.5 µs for LL128, x3 for Simple's completion
  and flush path). Every step of a multi-node ring costs at least the proxy's turn-around (NCCL's
  ``netOverhead``: 1 µs Intel / 2 µs AMD, x3 for Simple).

All functions are pure numpy, deterministic given a seeded :class:`numpy.random.Generator`.

>>> import numpy as np
>>> from dynamiccl.harness.simulator.topology import preset
>>> t = preset("h100-2x8")
>>> base = expected_time(t, "AllReduce", np.array([2**30]), "RING", "SIMPLE", 32, 2**21)
>>> slow = expected_time(t, "AllReduce", np.array([2**30]), "RING", "SIMPLE", 32, 2**21,
...                      NetworkState(link_bw_factor=0.5))
>>> bool(slow[0] > 1.5 * base[0])
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dynamiccl import contracts
from dynamiccl.harness.simulator.cost_model import (
    ALLGATHER, ALLREDUCE, FUNCS, LL, LL128, NCCL_STEPS, NVLS, NVLS_TREE, PAT, REDUCESCATTER, RING,
    SIMPLE, TREE, algo_index, func_index, proto_index,
)
from dynamiccl.harness.simulator.perf_reality import REAL, _vendor
from dynamiccl.harness.simulator.topology import Topology

__all__ = ["NetworkState", "REAL", "expected_time", "sample_durations", "busbw_factor", "busbw"]

Scalarish = float | Sequence[float]


@dataclass(frozen=True)
class NetworkState:
    """Current network conditions. Per-node fields describe that node's uplink (its NICs);
    per-rank fields describe one GPU. A scalar applies to all.

    * ``link_bw_factor`` (0, 1]: fraction of the uplink capacity that is usable (degraded link, lost rail).
    * ``added_latency_us`` >= 0: extra one-way latency per network crossing (queueing, longer path).
    * ``competing_share`` [0, 1): share of the uplink held by competing traffic against 8 NCCL flows.
    * ``rank_delay_us`` >= 0: how late each rank arrives at the collective (straggler).
    * ``rank_slowdown`` >= 1: each GPU's processing slowdown (slow/throttled GPU); the pipeline runs at the
      slowest rank's pace.
    * ``noise_sigma`` >= 0: log-normal run-to-run noise (per call and per rank).
    """

    link_bw_factor: Scalarish = 1.0
    added_latency_us: Scalarish = 0.0
    competing_share: Scalarish = 0.0
    rank_delay_us: Scalarish = 0.0
    rank_slowdown: Scalarish = 1.0
    noise_sigma: float = 0.02

    def _arr(self, name: str, n: int) -> np.ndarray:
        v = np.asarray(getattr(self, name), dtype=np.float64)
        if v.ndim == 0:
            return np.full(n, float(v))
        if v.shape != (n,):
            raise ValueError(f"{name} must be a scalar or have length {n}, got shape {v.shape}")
        return v

    def resolve(self, topology: Topology) -> dict[str, np.ndarray]:
        """Validate against a topology and broadcast every field to its per-node / per-rank array."""
        nn, nr = topology.n_nodes, topology.n_ranks
        out = {k: self._arr(k, nn) for k in ("link_bw_factor", "added_latency_us", "competing_share")}
        out.update({k: self._arr(k, nr) for k in ("rank_delay_us", "rank_slowdown")})
        if not np.all((out["link_bw_factor"] > 0) & (out["link_bw_factor"] <= 1)):
            raise ValueError("link_bw_factor must be in (0, 1]")
        if not np.all(out["added_latency_us"] >= 0):
            raise ValueError("added_latency_us must be >= 0")
        if not np.all((out["competing_share"] >= 0) & (out["competing_share"] < 1)):
            raise ValueError("competing_share must be in [0, 1)")
        if not np.all(out["rank_delay_us"] >= 0):
            raise ValueError("rank_delay_us must be >= 0")
        if not np.all(out["rank_slowdown"] >= 1):
            raise ValueError("rank_slowdown must be >= 1")
        if not self.noise_sigma >= 0:
            raise ValueError("noise_sigma must be >= 0")
        return out


_IDLE = NetworkState(noise_sigma=0.0)


def busbw_factor(func: str | int, n_ranks: int) -> float:
    """nccl-tests bus-bandwidth factor (nccl-plugin-abi.md §1.11 table)."""
    return contracts.busbw_factor(FUNCS[func_index(func)], n_ranks)


def busbw(func: str | int, nbytes: np.ndarray, time_us: np.ndarray, n_ranks: int) -> np.ndarray:
    """busbw in GB/s for the nccl-tests "size" ``nbytes`` (full buffer for AllGather/ReduceScatter)."""
    return np.asarray(nbytes, dtype=np.float64) / np.asarray(time_us) / 1000.0 * busbw_factor(func, n_ranks)


def _ceil_log2(x: int) -> int:
    return int(math.ceil(math.log2(x))) if x > 1 else 0


def expected_time(topology: Topology, func: str | int, nbytes: np.ndarray, algo: str | int,
                  proto: str | int, n_channels: int | np.ndarray, chunk: int | np.ndarray,
                  state: NetworkState | None = None) -> np.ndarray:
    """Noise-free duration (µs) of one collective, vectorised over ``nbytes`` (and optionally over
    ``n_channels``/``chunk`` arrays of the same length). ``inf`` for a cell this hardware cannot run.

    ``nbytes`` is what the tuner sees (full buffer for AllGather/ReduceScatter, nccl-plugin-abi.md §2.3).
    Arrival skew (stragglers) is not part of this: see :func:`sample_durations`.
    Parts: latency per hop (`_hops`), bandwidth per resource (`_bandwidths`), bytes and latency per
    algorithm (`_ALGO_COST`), pipeline fill (`_fill`).
    """
    st = (state or _IDLE).resolve(topology)
    t = topology
    f, a, p = func_index(func), algo_index(algo), proto_index(proto)
    S = np.asarray(nbytes, dtype=np.float64).reshape(-1)
    nch = np.broadcast_to(np.asarray(n_channels, dtype=np.float64), S.shape).astype(np.float64)
    ck = np.broadcast_to(np.asarray(chunk, dtype=np.float64), S.shape).astype(np.float64)
    if np.any(nch < 1) or np.any(ck < 1):
        raise ValueError("n_channels and chunk must be >= 1")
    if t.n_ranks == 1:
        return np.full(S.shape, REAL["launch_us"][SIMPLE])
    if not _cell_exists(t, f, a, p):
        return np.full(S.shape, np.inf)
    c = _Cell(t, f, a, p, S, nch, ck, REAL["ch_cap"][p][t.compcap_index])
    hop_intra, hop_net_max, one_way = _hops(c, st)
    b_intra, B_intra, B_net = _bandwidths(c, st, one_way)
    W_intra, W_net, t_lat, hops_intra, hops_net, W_rank = _ALGO_COST[a](c, hop_intra, hop_net_max)
    eff = REAL["tree_eff_2node"] if (a == TREE and t.n_nodes <= 2) else REAL["alg_eff"][a]
    t_bw = np.maximum(W_intra / B_intra, W_net / B_net)
    if p == LL and t.n_nodes > 1:
        # LL over the network is staged in host memory (NCCL net transport: LL buffers are never GPU
        # memory, the proxy checks every line's flag before it sends): a per-rank ceiling that depends on
        # the host, not on the NIC.
        t_bw = np.maximum(t_bw, W_rank / REAL["ll_net_bus_gbps"][_vendor(t)][0 if t.n_nodes == 2 else 1])
    t_bw = t_bw / 1000.0 / eff
    fill = _fill(c, b_intra, B_intra, B_net, hops_intra, hops_net)
    if a == TREE and p == LL128 and t.n_nodes > 1 and t.inter.tree_ll128_eff != 1.0:   # per-platform fitted
        t_bw, fill = t_bw / t.inter.tree_ll128_eff, fill / t.inter.tree_ll128_eff
    slow = float(st["rank_slowdown"].max())
    return REAL["launch_us"][p] + (t_lat + t_bw + fill) * slow


def _cell_exists(t: Topology, f: int, a: int, p: int) -> bool:
    """Whether this hardware can run the (algorithm, protocol) cell for this collective at all."""
    ppn, N = t.gpus_per_node, t.n_nodes
    if a in (NVLS, NVLS_TREE) and not (t.intra.nvls and ppn > 1 and p == SIMPLE):
        return False
    if a == NVLS_TREE and (N == 1 or f != ALLREDUCE):
        return False
    if a == NVLS and (N > 1 or f not in (ALLREDUCE, ALLGATHER, REDUCESCATTER)):
        return False
    if a == TREE and f != ALLREDUCE:
        return False
    if a == PAT and not (ppn == 1 and f in (ALLGATHER, REDUCESCATTER) and p == SIMPLE):
        return False
    return a in (TREE, RING, NVLS, NVLS_TREE, PAT)     # CollNet (needs SHARP hardware) is not modelled


@dataclass
class _Cell:
    """One collective's cell on one topology, vectorised over sizes ``S``."""
    t: Topology
    f: int
    a: int
    p: int
    S: np.ndarray
    nch: np.ndarray
    ck: np.ndarray
    cap: float            # per-channel bandwidth cap of the protocol on this GPU (GB/s)


def _hops(c: _Cell, st: dict):
    """Latency of one intra-node hop, of the slowest network crossing, and the one-way network
    latency per node (with the added latency and the competing traffic's queueing)."""
    t, a, p = c.t, c.a, c.p
    net_kind = t.inter.kind
    share = st["competing_share"]
    base_net_lat = t.inter.latency_us + REAL["net_sw_us"][net_kind]
    queue_lat = base_net_lat * share / (1.0 - share)
    one_way = base_net_lat + st["added_latency_us"] + queue_lat                          # per node, one crossing
    hop_net = one_way * REAL["net_lat_mult"][p] + REAL["proto_net_us"][p]
    if p == LL:     # per-platform fitted extra per crossing of host-staged LL (InterNet.ll_crossing_us)
        hop_net = hop_net + t.inter.ll_crossing_us
    hop_intra = t.intra.latency_us * (REAL["intra_hop_rel"][t.intra.kind][a][p] if a in (TREE, RING) else 1.0)
    return hop_intra, float(hop_net.max()), one_way


def _bandwidths(c: _Cell, st: dict, one_way: np.ndarray):
    """Per-GPU intra-node bandwidth (link, and the channels' share of it) and the network's
    per-node bandwidth (GB/s = B/ns): the slowest uplink's fair share against competing flows,
    capped per channel by the protocol, the chunk cost and the proxy's steps in flight per RTT."""
    t, f, a, p, S, nch, ck, cap = c.t, c.f, c.a, c.p, c.S, c.nch, c.ck, c.cap
    net_kind = t.inter.kind
    eta = REAL["proto_eff"][p]
    b_intra = t.intra.bw_gbps * (REAL["nvlink_eff_by_arch"][t.compcap_index] if t.intra.kind == "nvlink"
                                 else REAL["link_eff"][t.intra.kind])
    if a in (NVLS, NVLS_TREE):
        b_intra = t.intra.bw_gbps * REAL["nvls_eff"]
    B_intra = np.minimum(b_intra * eta, nch * cap)
    if t.n_nodes <= 1:
        return b_intra, B_intra, np.full(S.shape, np.inf)
    eta_net = eta * (REAL["net_ll128_eff"][net_kind] if p == LL128 else 1.0) * (
        REAL["net_ll_eff"][net_kind] if p == LL else 1.0)
    share = st["competing_share"]
    flows = nch[:, None]
    m = REAL["ref_flows"] * share[None, :] / (1.0 - share[None, :])
    fair = flows / (flows + m) if np.any(share > 0) else np.ones((S.size, t.n_nodes))
    node_cap = t.nics_used * t.inter.nic_bw_gbps * REAL["link_eff"][net_kind]
    B_node = node_cap * np.min(st["link_bw_factor"][None, :] * fair, axis=1)       # slowest uplink paces the pipeline
    chunk_steps = NCCL_STEPS // 2 if (a == RING and p == SIMPLE and f in (
        ALLREDUCE, ALLGATHER, REDUCESCATTER)) else 1
    rtt = 2.0 * float(one_way.max())
    per_ch = np.minimum.reduce([
        np.full(S.shape, cap),
        ck / REAL["chunk_cost_us"][net_kind] / 1000.0,
        NCCL_STEPS * (ck / chunk_steps) / rtt / 1000.0,
    ])
    return b_intra, B_intra, np.minimum(B_node * eta_net, nch * per_ch)


# --- bytes over each resource (per GPU egress intra, per node egress inter) and latency, per algorithm:
# (W_intra, W_net, latency µs, store-and-forward hops intra / network, bytes per rank)
def _ring(c: _Cell, hop_intra: float, hop_net_max: float):
    t, f, p, S = c.t, c.f, c.p, c.S
    n, N, ppn = t.n_ranks, t.n_nodes, t.gpus_per_node
    nsteps = {ALLREDUCE: 2 * (n - 1), ALLGATHER: n - 1, REDUCESCATTER: n - 1}.get(f, n)
    w = {ALLREDUCE: 2.0 * (n - 1) / n, ALLGATHER: (n - 1) / n, REDUCESCATTER: (n - 1) / n}.get(f, 1.0)
    n_inter = 0 if N == 1 else (2 * (N - 1) if f == ALLREDUCE else N - 1)
    step_intra = hop_intra
    if N > 1:   # the proxy paces every step of a multi-node ring (NCCL's netOverhead, §1.1/§1.4)
        step_intra = max(hop_intra, REAL["net_overhead_us"][_vendor(t)] * (3.0 if p == SIMPLE else 1.0))
    t_lat = (nsteps - n_inter) * step_intra + n_inter * hop_net_max
    return (w * S if ppn > 1 else 0.0 * S), (w * S if N > 1 else 0.0 * S), t_lat, 0, 0, w * S


def _tree(c: _Cell, hop_intra: float, hop_net_max: float):
    S, N, ppn = c.S, c.t.n_nodes, c.t.gpus_per_node
    levels = _ceil_log2(N)
    t_lat = 2 * ((ppn - 1) * hop_intra + levels * hop_net_max)
    # reduce of chunk k+1 overlaps bcast of chunk k: one hop fewer to fill (a network hop if any)
    hops_intra, hops_net = 2 * (ppn - 1), 2 * levels
    if hops_net:
        hops_net -= 1
    else:
        hops_intra = max(1, hops_intra - 1)
    return ((2.0 * S if ppn > 1 else 0.0 * S), ((1.0 if N == 2 else 2.0) * S if N > 1 else 0.0 * S), t_lat,
            hops_intra, hops_net, 2.0 * S)


def _nvls(c: _Cell, hop_intra: float, hop_net_max: float):
    n, S = c.t.n_ranks, c.S
    W_intra = S if c.f == ALLREDUCE else (n - 1) / n * S
    return W_intra, 0.0 * S, REAL["nvls_lat_us"], 2, 0, W_intra


def _nvls_tree(c: _Cell, hop_intra: float, hop_net_max: float):
    S, N = c.S, c.t.n_nodes
    levels = _ceil_log2(N)
    t_lat = REAL["nvls_lat_us"] + 2 * levels * hop_net_max + c.t.inter.nvls_tree_extra_us   # fitted, 0 default
    return S, (1.0 if N == 2 else 2.0) * S, t_lat, 2, 2 * levels, S


def _pat(c: _Cell, hop_intra: float, hop_net_max: float):   # one GPU per node
    n, S = c.t.n_ranks, c.S
    W_net = (n - 1) / n * S
    return 0.0 * S, W_net, _ceil_log2(n) * hop_net_max + 0.5 * n, 0, _ceil_log2(n), W_net


_ALGO_COST = {RING: _ring, TREE: _tree, NVLS: _nvls, NVLS_TREE: _nvls_tree, PAT: _pat}


def _fill(c: _Cell, b_intra: float, B_intra, B_net, hops_intra: int, hops_net: int):
    """Pipeline fill of store-and-forward algorithms (µs): each hop holds one grain before passing it on.
    NVLink hops forward LL/LL128 line by line (``pipeline_grain``); a network hop forwards whole chunks (the
    proxy sends a step once it is complete). Each hop fills at its own per-channel rate.
    Tree chains are rotations of one another: NCCL's search starts each channel's chain at the GPU of that
    channel's NIC and, on NVSwitch systems, walks to the neighbouring GPU (search.cc
    ``ncclTopoSearchNextGpuSort``: "NVSwitches prefer when we talk to a limited set of peers"). While the
    pipeline fills, a GPU therefore forwards only the channels for which it sits at the current chain
    position (nCh / #distinct heads), not all nCh: a channel's grain moves at its share of NVLink among
    those, up to the per-channel cap. (Steady state still shares the link among all channels: t_bw.)"""
    t, a, p, S, nch, ck = c.t, c.a, c.p, c.S, c.nch, c.ck
    N, ppn = t.n_nodes, t.gpus_per_node
    per_ch_seg = S / nch
    r_fill = B_intra / nch
    if a == TREE and ppn > 1:
        heads = max(1, min(t.nics_used, ppn)) if (N > 1 and t.intra.nvswitch) else 1
        r_fill = np.minimum(c.cap, b_intra * REAL["proto_eff"][p] * heads / nch)
    fill_intra = hops_intra * np.minimum(np.minimum(ck, REAL["pipeline_grain"][p]), per_ch_seg) / r_fill
    fill_net = hops_net * np.minimum(ck, per_ch_seg) / (B_net / nch) if N > 1 else 0.0
    return (fill_intra + fill_net) / 1000.0


def sample_durations(topology: Topology, func: str | int, nbytes: np.ndarray, algo: str | int,
                     proto: str | int, n_channels: int | np.ndarray, chunk: int | np.ndarray,
                     state: NetworkState | None = None, *, rng: np.random.Generator) -> np.ndarray:
    """Per-rank measured durations (µs), shape ``(len(nbytes), n_ranks)``.

    Each rank measures from its own arrival (``rank_delay_us``) to the common finish
    ``max(arrival) + T``, so peers of a straggler wait and the straggler's own duration is the shortest.
    Noise: one log-normal factor per call (shared fabric jitter) and one per rank (measurement jitter).
    """
    state = state or NetworkState()
    st = state.resolve(topology)
    T = expected_time(topology, func, nbytes, algo, proto, n_channels, chunk, state)
    nr = topology.n_ranks
    sig = state.noise_sigma
    shared = rng.lognormal(0.0, sig, size=(T.size, 1)) if sig > 0 else np.ones((T.size, 1))
    per_rank = rng.lognormal(0.0, sig / 4, size=(T.size, nr)) if sig > 0 else np.ones((T.size, nr))
    arrival = st["rank_delay_us"][None, :]
    finish = arrival.max() + T[:, None] * shared
    return (finish - arrival) * per_rank
