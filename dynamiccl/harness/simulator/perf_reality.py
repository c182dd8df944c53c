"""The simulator's constants of "reality" (`dynamiccl.harness.simulator.perf_model`): each a physical or
published number, or a calibration knob marked as such (fitted once against the table in
dynamiccl/harness/simulator/calibration.py, never per point)."""
from __future__ import annotations

import numpy as np

from dynamiccl.harness.simulator.cost_model import NVLS, NVLS_TREE, PAT, RING, TREE
from dynamiccl.nccl_model.topology import Topology

__all__ = ["REAL"]


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
