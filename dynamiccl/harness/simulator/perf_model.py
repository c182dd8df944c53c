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
from dynamiccl.harness.simulator.topology import Topology

__all__ = ["NetworkState", "REAL", "expected_time", "sample_durations", "busbw_factor", "busbw"]

Scalarish = float | Sequence[float]


# ------------------------------------------------------------------------------------------------
# Constants of "reality". Each is a physical or published number, or a calibration knob marked as such
# (fitted once against the table in dynamiccl/harness/simulator/calibration.py, never per point).
# ------------------------------------------------------------------------------------------------
REAL = {
    # Fraction of line rate a link delivers to NCCL Simple. NVLink: 370 of 450 GB/s Ring busbw
    # (nccl-tests#212, "~20 % protocol overhead"); IB: 46–48 GB/s per 400G NIC, 24 per 200G (§4.1);
    # RoCE/EFA/TCP lower (calibration knobs; RoCE ~ nccl#1368, TCP ~ §4.4 (c)).
    "link_eff": {"nvlink": 0.82, "pcie": 0.80, "ib": 0.95, "roce": 0.92, "efa": 0.90, "tcp": 0.70},
    # NVLink efficiency by generation (Volta, Ampere, Hopper, Blackwell): A100 x 8 reaches ~200–230 of
    # 300 GB/s (§4.2 nccl-tests#149/#178, §0 point 10) vs H100's 370 of 450. Replaces link_eff["nvlink"].
    "nvlink_eff_by_arch": (0.75, 0.72, 0.82, 0.82),
    # Wire efficiency per protocol: LL 8 B stores carry 4 B data; LL128 120/128 (nccl#281, §4.1).
    "proto_eff": (0.5, 120.0 / 128.0, 1.0),
    # LL128 over a network additionally loses to fine-grained 128 B synchronisation ("Demystifying NCCL",
    # §8.7: LL128 can underperform Simple inter-node at large sizes). Calibration knob per fabric.
    "net_ll128_eff": {"ib": 0.95, "roce": 0.85, "efa": 0.80, "tcp": 0.5},
    "net_ll_eff": {"ib": 1.0, "roce": 1.0, "efa": 0.6, "tcp": 0.3},
    # Per-channel throughput caps (GB/s) by proto x arch (Volta, Ampere, Hopper, Blackwell). Calibration
    # knobs of the same order as NCCL's own per-channel caps (§1.1), but not equal to them.
    "ch_cap": np.array([
        [3.0, 5.0, 8.0, 12.0],       # LL
        [12.0, 20.0, 36.0, 45.0],    # LL128
        [20.0, 30.0, 55.0, 95.0],    # Simple
    ]),
    # NVLS delivers ~275 GB/s algbw (busbw ~480) on 8 x H100 with 450 GB/s NVLink (nccl-tests#212).
    "nvls_eff": 275.0 / 450.0,
    "nvls_lat_us": 6.0,
    # Algorithm efficiency vs. its ideal byte count. Tree with interior nodes (> 2 nodes): RoCE 5 nodes
    # Ring 190 vs Tree 150 (nccl#1368); a 2-node tree is a single edge and pays no such loss.
    "alg_eff": {TREE: 0.80, RING: 1.0, NVLS: 1.0, NVLS_TREE: 0.97, PAT: 0.90},
    "tree_eff_2node": 1.0,
    # Kernel launch + setup per collective (µs) by protocol. 2 x A100 NVLink 32 B AllReduce ~10.1 µs
    # (nccl#583) = launch + 2 LL hops.
    "launch_us": (8.5, 9.5, 10.0),
    # Per-hop cost of an intra-node Ring/Tree step relative to a Ring/LL step, by (algo, proto): NCCL's
    # measured NVLink / PCI hwLat (§1.1) divided by its Ring/LL entry (NVLink: Ring .6/1.9/3.4, Tree
    # .6/1.25/4.0), applied to the link's own latency (``intra.latency_us`` = one Ring/LL step).
    "intra_hop_rel": {
        "nvlink": {TREE: (1.0, 1.25 / 0.6, 4.0 / 0.6), RING: (1.0, 1.9 / 0.6, 3.4 / 0.6)},
        "pcie": {TREE: (1.0, 1.9, 4.0), RING: (1.0, 2.5, 5.7)},
    },
    # Network crossing = one-way latency x ``net_lat_mult`` + ``proto_net_us``. The wire does not know the
    # protocol: LL and LL128 see the data land (flags in the data); LL128 pays NCCL's IB-measured extra per
    # network hop (§1.1 NET hwLat, Tree: LL128 8.5 - LL 5.0 = 3.5 µs). Simple waits for the proxy to see the
    # completion and flush before the GPU may read (NCCL charges latencyInter twice for Simple, §1.4):
    # modelled as three one-way latencies (calibration knob, keeps the NVLSTree onset of §4.5).
    "net_lat_mult": (1.0, 1.0, 3.0),
    "proto_net_us": (0.0, 3.5, 0.0),
    # Proxy/network software cost per network hop (µs), added to the link latency. EFA presets take the
    # libfabric-level one-way latency AWS measured (§8.4 net_lat), so only NCCL's proxy remains.
    "net_sw_us": {"ib": 1.5, "roce": 1.5, "efa": 1.5, "tcp": 20.0},
    # Fixed cost per chunk on a network connection (µs): limits a channel to chunk/γ (nccl#2409).
    "chunk_cost_us": {"ib": 1.0, "roce": 2.0, "efa": 3.0, "tcp": 8.0},
    # Pipelining grain of store-and-forward stages (bytes): LL/LL128 forward line by line (a warp's worth of
    # 8 B / 128 B lines), Simple forwards whole chunks. Calibration knobs.
    "pipeline_grain": (4096.0, 16384.0, float("inf")),
    # Reference flow count against which ``competing_share`` is expressed.
    "ref_flows": 8.0,
    # Proxy CPU cost per pipeline step of a multi-node Ring (µs) by host CPU, x3 for Simple: NCCL's
    # ``netOverhead`` (§1.1 "Net overhead": Intel 1.0, AMD 2.0; §1.4: every intra-node step of a multi-node ring
    # costs ``max(intraLat, netOverhead)``). A ring is one pipeline: each of its 2(n-1) steps waits for the
    # proxy thread that progresses the network connections, so no step is faster than the proxy's turn-around.
    "net_overhead_us": {"intel": 1.0, "amd": 2.0},
    # LL across nodes: per-rank bus-bandwidth ceiling (GB/s) by host CPU for (2 nodes, > 2 nodes). NCCL's own
    # empirically tuned multi-node llMaxBw, whose row is picked by CPU vendor (§1.1: Intel 39.0 / 20.4, AMD
    # 22.5 / 19.0); corroborated by the A3 Mega 2x8 sweep (§4.4 (a), Intel hosts): ~20 GB/s algbw from 1 to
    # 16 MiB, i.e. 39 GB/s of bus bandwidth.
    "ll_net_bus_gbps": {"intel": (39.0, 20.4), "amd": (22.5, 19.0)},
}


def _vendor(t: Topology) -> str:
    return "amd" if t.cpu_vendor == "amd" else "intel"


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
    """
    st = (state or _IDLE).resolve(topology)
    t = topology
    f, a, p = func_index(func), algo_index(algo), proto_index(proto)
    S = np.asarray(nbytes, dtype=np.float64).reshape(-1)
    nch = np.broadcast_to(np.asarray(n_channels, dtype=np.float64), S.shape).astype(np.float64)
    ck = np.broadcast_to(np.asarray(chunk, dtype=np.float64), S.shape).astype(np.float64)
    if np.any(nch < 1) or np.any(ck < 1):
        raise ValueError("n_channels and chunk must be >= 1")
    n, N, ppn, cc = t.n_ranks, t.n_nodes, t.gpus_per_node, t.compcap_index
    inf = np.full(S.shape, np.inf)
    if n == 1:
        return np.full(S.shape, REAL["launch_us"][SIMPLE])
    # --- which cells exist physically ---
    if a in (NVLS, NVLS_TREE) and not (t.intra.nvls and ppn > 1 and p == SIMPLE):
        return inf
    if a == NVLS_TREE and (N == 1 or f != ALLREDUCE):
        return inf
    if a == NVLS and (N > 1 or f not in (ALLREDUCE, ALLGATHER, REDUCESCATTER)):
        return inf
    if a == TREE and f != ALLREDUCE:
        return inf
    if a == PAT and not (ppn == 1 and f in (ALLGATHER, REDUCESCATTER) and p == SIMPLE):
        return inf
    if a not in (TREE, RING, NVLS, NVLS_TREE, PAT):
        return inf          # CollNet (needs SHARP hardware) is not modelled
    net_kind = t.inter.kind
    eta = REAL["proto_eff"][p]
    eta_net = eta * (REAL["net_ll128_eff"][net_kind] if p == LL128 else 1.0) * (
        REAL["net_ll_eff"][net_kind] if p == LL else 1.0)
    cap = REAL["ch_cap"][p][cc]

    # --- network state ---
    share = st["competing_share"]
    bwf = st["link_bw_factor"]
    added = st["added_latency_us"]
    base_net_lat = t.inter.latency_us + REAL["net_sw_us"][net_kind]
    queue_lat = base_net_lat * share / (1.0 - share)
    one_way = base_net_lat + added + queue_lat                          # per node, one crossing
    hop_net = one_way * REAL["net_lat_mult"][p] + REAL["proto_net_us"][p]
    if p == LL:     # per-platform fitted extra per crossing of host-staged LL (InterNet.ll_crossing_us)
        hop_net = hop_net + t.inter.ll_crossing_us
    hop_net_max = float(hop_net.max())
    hop_intra = t.intra.latency_us * (REAL["intra_hop_rel"][t.intra.kind][a][p] if a in (TREE, RING) else 1.0)

    # --- bandwidths (GB/s = B/ns; times below in µs via /1000) ---
    b_intra = t.intra.bw_gbps * (REAL["nvlink_eff_by_arch"][cc] if t.intra.kind == "nvlink"
                                 else REAL["link_eff"][t.intra.kind])
    if a in (NVLS, NVLS_TREE):
        b_intra = t.intra.bw_gbps * REAL["nvls_eff"]
    B_intra = np.minimum(b_intra * eta, nch * cap)
    if N > 1:
        flows = nch[:, None]
        m = REAL["ref_flows"] * share[None, :] / (1.0 - share[None, :])
        fair = flows / (flows + m) if np.any(share > 0) else np.ones((S.size, N))
        node_cap = t.nics_used * t.inter.nic_bw_gbps * REAL["link_eff"][net_kind]
        B_node = node_cap * np.min(bwf[None, :] * fair, axis=1)       # slowest uplink paces the pipeline
        chunk_steps = NCCL_STEPS // 2 if (a == RING and p == SIMPLE and f in (
            ALLREDUCE, ALLGATHER, REDUCESCATTER)) else 1
        rtt = 2.0 * float(one_way.max())
        per_ch = np.minimum.reduce([
            np.full(S.shape, cap),
            ck / REAL["chunk_cost_us"][net_kind] / 1000.0,
            NCCL_STEPS * (ck / chunk_steps) / rtt / 1000.0,
        ])
        B_net = np.minimum(B_node * eta_net, nch * per_ch)
    else:
        B_net = np.full(S.shape, np.inf)

    # --- bytes over each resource (per GPU egress intra, per node egress inter) and latency ---
    nsteps = {ALLREDUCE: 2 * (n - 1), ALLGATHER: n - 1, REDUCESCATTER: n - 1}.get(f, n)
    if a == RING:
        w = {ALLREDUCE: 2.0 * (n - 1) / n, ALLGATHER: (n - 1) / n, REDUCESCATTER: (n - 1) / n}.get(f, 1.0)
        W_intra = w * S if ppn > 1 else 0.0 * S
        W_net = w * S if N > 1 else 0.0 * S
        n_inter = 0 if N == 1 else (2 * (N - 1) if f == ALLREDUCE else N - 1)
        step_intra = hop_intra
        if N > 1:   # the proxy paces every step of a multi-node ring (NCCL's netOverhead, §1.1/§1.4)
            step_intra = max(hop_intra, REAL["net_overhead_us"][_vendor(t)] * (3.0 if p == SIMPLE else 1.0))
        t_lat = (nsteps - n_inter) * step_intra + n_inter * hop_net_max
        hops_intra, hops_net = 0, 0
        W_rank = w * S
    elif a == TREE:
        W_intra = 2.0 * S if ppn > 1 else 0.0 * S
        W_net = (1.0 if N == 2 else 2.0) * S if N > 1 else 0.0 * S
        levels = _ceil_log2(N)
        t_lat = 2 * ((ppn - 1) * hop_intra + levels * hop_net_max)
        # reduce of chunk k+1 overlaps bcast of chunk k: one hop fewer to fill (a network hop if any)
        hops_intra, hops_net = 2 * (ppn - 1), 2 * levels
        if hops_net:
            hops_net -= 1
        else:
            hops_intra = max(1, hops_intra - 1)
        W_rank = 2.0 * S
    elif a == NVLS:
        W_intra = S if f == ALLREDUCE else (n - 1) / n * S
        W_net = 0.0 * S
        t_lat = REAL["nvls_lat_us"]
        hops_intra, hops_net = 2, 0
        W_rank = W_intra
    elif a == NVLS_TREE:
        W_intra = S
        W_net = (1.0 if N == 2 else 2.0) * S
        levels = _ceil_log2(N)
        t_lat = REAL["nvls_lat_us"] + 2 * levels * hop_net_max + t.inter.nvls_tree_extra_us   # fitted, 0 default
        hops_intra, hops_net = 2, 2 * levels
        W_rank = W_intra
    else:  # PAT, one GPU per node
        W_intra = 0.0 * S
        W_net = (n - 1) / n * S
        t_lat = _ceil_log2(n) * hop_net_max + 0.5 * n
        hops_intra, hops_net = 0, _ceil_log2(n)
        W_rank = W_net

    eff = REAL["tree_eff_2node"] if (a == TREE and N <= 2) else REAL["alg_eff"][a]
    t_bw = np.maximum(W_intra / B_intra, W_net / B_net)
    if p == LL and N > 1:
        # LL over the network is staged in host memory (NCCL net transport: LL buffers are never GPU
        # memory, the proxy checks every line's flag before it sends): a per-rank ceiling that depends on
        # the host, not on the NIC.
        t_bw = np.maximum(t_bw, W_rank / REAL["ll_net_bus_gbps"][_vendor(t)][0 if N == 2 else 1])
    t_bw = t_bw / 1000.0 / eff
    # Pipeline fill of store-and-forward algorithms: each hop holds one grain before passing it on. NVLink
    # hops forward LL/LL128 line by line (``pipeline_grain``); a network hop forwards whole chunks (the proxy
    # sends a step once it is complete). Each hop fills at its own per-channel rate.
    # Tree chains are rotations of one another: NCCL's search starts each channel's chain at the GPU of that
    # channel's NIC and, on NVSwitch systems, walks to the neighbouring GPU (search.cc
    # ``ncclTopoSearchNextGpuSort``: "NVSwitches prefer when we talk to a limited set of peers"). While the
    # pipeline fills, a GPU therefore forwards only the channels for which it sits at the current chain
    # position (nCh / #distinct heads), not all nCh: a channel's grain moves at its share of NVLink among
    # those, up to the per-channel cap. (Steady state still shares the link among all channels: t_bw.)
    per_ch_seg = S / nch
    r_fill = B_intra / nch
    if a == TREE and ppn > 1:
        heads = max(1, min(t.nics_used, ppn)) if (N > 1 and t.intra.nvswitch) else 1
        r_fill = np.minimum(cap, b_intra * eta * heads / nch)
    fill_intra = hops_intra * np.minimum(np.minimum(ck, REAL["pipeline_grain"][p]), per_ch_seg) / r_fill
    fill_net = hops_net * np.minimum(ck, per_ch_seg) / (B_net / nch) if N > 1 else 0.0
    fill = (fill_intra + fill_net) / 1000.0
    if a == TREE and p == LL128 and N > 1 and t.inter.tree_ll128_eff != 1.0:   # per-platform fitted, 1 default
        t_bw, fill = t_bw / t.inter.tree_ll128_eff, fill / t.inter.tree_ll128_eff
    slow = float(st["rank_slowdown"].max())
    return REAL["launch_us"][p] + (t_lat + t_bw + fill) * slow


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
