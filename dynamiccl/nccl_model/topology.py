"""Typed, validated description of one job's hardware: nodes, GPUs, intra-node links and the network.

Two layers live here:

* the **physical** topology (:class:`Topology`): link kinds, bandwidths, latencies, NIC counts, GPU
  generation. The simulator's performance model works from these numbers.
* the **graph** (:class:`GraphParams`): what NCCL's topology search would report per channel
  (``nChannels``, ``bwIntra``, ``bwInter``, ``latencyInter``; ``nccl-cost-model.md`` §1.2). NCCL's cost model
  (:mod:`dynamiccl.nccl_model.cost_model`) takes these as inputs. A preset can pin them (the presets below pin the values
  the reference's §2 worked predictions assume); otherwise :func:`derive_graph` estimates them.

Units: bandwidth GB/s (1 GB/s = 1000 B/µs), latency µs.

>>> t = preset("h100-2x8")
>>> t.n_ranks, t.n_nodes, t.compcap_index
(16, 2, 2)
>>> g = t.graph_params()
>>> (g.n_channels, g.bw_intra, g.bw_inter)
(8, 48.0, 48.0)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = [
    "GPU_ARCHS",
    "INTRA_KINDS",
    "NET_KINDS",
    "IntraLink",
    "InterNet",
    "GraphParams",
    "Topology",
    "derive_graph",
    "preset",
    "preset_names",
    "load_yaml",
    "from_dict",
]

#: GPU generation -> (compcap index used by NCCL's tables, a representative SM version).
GPU_ARCHS: dict[str, tuple[int, int]] = {
    "volta": (0, 70),
    "ampere": (1, 80),
    "hopper": (2, 90),
    "blackwell": (3, 100),
}
INTRA_KINDS = ("nvlink", "pcie")
NET_KINDS = ("ib", "roce", "tcp", "efa")

MAXCHANNELS = 64  # nccl-cost-model.md §1.2


@dataclass(frozen=True)
class IntraLink:
    """Intra-node GPU<->GPU connectivity, per GPU.

    ``bw_gbps`` is the per-GPU aggregate unidirectional line rate (H100 SXM: 18 NVLinks x 25 GB/s = 450;
    nccl-cost-model.md §4.1). ``nvls`` = NVLink SHARP (NVSwitch multicast) available.
    """

    kind: str = "nvlink"
    bw_gbps: float = 450.0
    latency_us: float = 0.8
    nvls: bool = False
    nvswitch: bool = True

    def validate(self) -> None:
        if self.kind not in INTRA_KINDS:
            raise ValueError(f"intra.kind must be one of {INTRA_KINDS}, got {self.kind!r}")
        if not self.bw_gbps > 0:
            raise ValueError("intra.bw_gbps must be > 0")
        if not self.latency_us >= 0:
            raise ValueError("intra.latency_us must be >= 0")
        if self.nvls and self.kind != "nvlink":
            raise ValueError("intra.nvls requires intra.kind == 'nvlink'")


@dataclass(frozen=True)
class InterNet:
    """Inter-node network. ``nic_bw_gbps`` is the line rate of one NIC (400 Gb/s -> 50 GB/s).

    ``plugin_latency_us`` is the ``latency`` property the net plugin reports, which NCCL adds to its inter-node
    latency (``graph.latencyInter``; 0 for NCCL's IB plugin, 35/75 µs for aws-ofi-nccl; §1.2).
    ``latency_us`` is the *physical* one-way latency the performance model uses.
    """

    kind: str = "ib"
    nic_bw_gbps: float = 50.0
    latency_us: float = 4.0
    nics_per_node: int = 8
    plugin_latency_us: float = 0.0
    gpu_nic_local: bool = True
    # Per-platform FITTED terms, neutral by default (every preset but p5 leaves them so: bit-identical). Fitted to
    # AWS's 16-rank AllReduce regions (reference §4.5) and checked on regions held out of the fit (32/64 ranks,
    # AllGather/ReduceScatter): `python -m dynamiccl.harness.simulator.aws_regions --search`, dynamiccl/harness/simulator/README.md "Per-platform
    # fit". Only ``ll_crossing_us`` on p5 passed that check; the other two are the candidates that did not.
    ll_crossing_us: float = 0.0        # extra µs per network crossing of host-staged LL
    tree_ll128_eff: float = 1.0        # efficiency of multi-node Tree/LL128's bandwidth + fill terms (candidate)
    nvls_tree_extra_us: float = 0.0    # extra NVLSTree latency, µs (candidate)

    def validate(self) -> None:
        if self.kind not in NET_KINDS:
            raise ValueError(f"inter.kind must be one of {NET_KINDS}, got {self.kind!r}")
        if not self.nic_bw_gbps > 0:
            raise ValueError("inter.nic_bw_gbps must be > 0")
        if not self.latency_us >= 0:
            raise ValueError("inter.latency_us must be >= 0")
        if not (isinstance(self.nics_per_node, int) and self.nics_per_node >= 1):
            raise ValueError("inter.nics_per_node must be an int >= 1")
        if not self.plugin_latency_us >= 0:
            raise ValueError("inter.plugin_latency_us must be >= 0")
        if not self.ll_crossing_us >= 0:
            raise ValueError("inter.ll_crossing_us must be >= 0")
        if not 0.0 < self.tree_ll128_eff <= 1.0:
            raise ValueError("inter.tree_ll128_eff must be in (0, 1]")
        if not self.nvls_tree_extra_us >= 0:
            raise ValueError("inter.nvls_tree_extra_us must be >= 0")


@dataclass(frozen=True)
class GraphParams:
    """Per-channel values of NCCL's topology search (§1.2), the inputs of ``ncclTopoTuneModel``.

    ``n_channels``/``bw_intra``/``bw_inter`` describe the ring and tree graphs (taken equal here),
    ``nvls_*`` the NVLS graph. ``comm_channels`` is ``comm->nChannels`` (the channel budget at run time);
    ``None`` means "apply NCCL's connect-time duplication" (§1.2).
    """

    n_channels: int
    bw_intra: float
    bw_inter: float
    latency_inter: float = 0.0
    nvls_channels: int = 16
    nvls_bw_intra: float = 0.0
    nvls_bw_inter: float = 0.0
    comm_channels: int | None = None
    same_channels: bool = True
    tree_pattern_balanced: bool = True

    def validate(self) -> None:
        if not (isinstance(self.n_channels, int) and 1 <= self.n_channels <= MAXCHANNELS):
            raise ValueError(f"graph.n_channels must be an int in [1, {MAXCHANNELS}]")
        if not (self.bw_intra > 0 and self.bw_inter > 0):
            raise ValueError("graph.bw_intra and graph.bw_inter must be > 0")
        if not self.latency_inter >= 0:
            raise ValueError("graph.latency_inter must be >= 0")
        if not (isinstance(self.nvls_channels, int) and 0 <= self.nvls_channels <= MAXCHANNELS):
            raise ValueError(f"graph.nvls_channels must be an int in [0, {MAXCHANNELS}]")
        if self.comm_channels is not None and not (1 <= self.comm_channels <= MAXCHANNELS):
            raise ValueError(f"graph.comm_channels must be in [1, {MAXCHANNELS}]")


@dataclass(frozen=True)
class Topology:
    """One job: ``nodes`` x ``gpus_per_node`` GPUs of generation ``gpu``.

    ``tp``/``dp`` are informational (which communicator this preset stands for).
    """

    name: str
    nodes: int
    gpus_per_node: int
    gpu: str = "hopper"
    intra: IntraLink = field(default_factory=IntraLink)
    inter: InterNet = field(default_factory=InterNet)
    graph: GraphParams | None = None
    cpu_vendor: str = "intel"
    collnet_enable: bool = False
    description: str = ""

    # ---- validation -------------------------------------------------------------------------------
    def validate(self) -> "Topology":
        if not (isinstance(self.nodes, int) and self.nodes >= 1):
            raise ValueError("nodes must be an int >= 1")
        if not (isinstance(self.gpus_per_node, int) and 1 <= self.gpus_per_node <= 72):
            raise ValueError("gpus_per_node must be an int in [1, 72]")
        if self.gpu not in GPU_ARCHS:
            raise ValueError(f"gpu must be one of {tuple(GPU_ARCHS)}, got {self.gpu!r}")
        if self.cpu_vendor not in ("intel", "amd", "arm", "other"):
            raise ValueError("cpu_vendor must be one of ('intel', 'amd', 'arm', 'other')")
        self.intra.validate()
        self.inter.validate()
        if self.intra.nvls and GPU_ARCHS[self.gpu][1] < 90:
            raise ValueError("intra.nvls requires gpu 'hopper' or 'blackwell'")
        if self.graph is not None:
            self.graph.validate()
        return self

    # ---- derived quantities -----------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return self.nodes

    @property
    def n_ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def compcap_index(self) -> int:
        return GPU_ARCHS[self.gpu][0]

    @property
    def sm(self) -> int:
        return GPU_ARCHS[self.gpu][1]

    @property
    def nics_used(self) -> int:
        """NICs a node drives: NCCL pairs each GPU with its closest NIC, so at most one per GPU."""
        return min(self.inter.nics_per_node, self.gpus_per_node) if self.nodes > 1 else 0

    def graph_params(self) -> GraphParams:
        return self.graph if self.graph is not None else derive_graph(self)


# Net efficiency used to turn a NIC's line rate into NCCL's per-channel search speed (200G -> 24,
# 400G -> 48: nccl-cost-model.md §4.1 rules of thumb).
_NIC_SEARCH_EFF = 0.96


def derive_graph(t: Topology) -> GraphParams:
    """Estimate NCCL's search result when a topology does not pin it (an approximation, not NCCL's search).

    * single node: 24 channels (12 on Volta) carrying 80 % of the NVLink line rate -> H100: 24 x 15 GB/s,
      the value the reference's §2 (a) assumes; NVLS graph: 16 channels of ``bw/15`` (H100: 30 -> NCCL's
      model gives NVLS algbw ~274, busbw ~480, matching §4.1).
    * multi node: one channel per NIC used, at 96 % of the NIC line rate (§2 (b)/(d): 8 x 48, 8 x 24);
      ``bwIntra = bwInter`` as in NCCL's multi-node ring graph.
    """
    nvls_ch = 16 if t.intra.nvls else 0
    if t.nodes == 1:
        nch = 12 if t.gpu == "volta" else 24
        if t.intra.kind == "pcie":
            nch = 2
        bw = round(t.intra.bw_gbps * 0.8 / nch, 2)
        nvls_bw = round(t.intra.bw_gbps / 15.0, 2)
        return GraphParams(n_channels=nch, bw_intra=bw, bw_inter=bw, latency_inter=0.0,
                           nvls_channels=nvls_ch, nvls_bw_intra=nvls_bw, nvls_bw_inter=nvls_bw)
    nch = max(1, t.nics_used)
    bw = round(t.inter.nic_bw_gbps * _NIC_SEARCH_EFF, 2)
    nvls_intra = round(t.intra.bw_gbps / 15.0, 2)
    nvls_inter = round(bw * nch / max(nvls_ch, 1), 2)
    return GraphParams(n_channels=nch, bw_intra=bw, bw_inter=bw,
                       latency_inter=t.inter.plugin_latency_us, nvls_channels=nvls_ch,
                       nvls_bw_intra=nvls_intra, nvls_bw_inter=nvls_inter)


# -------------------------------------------------------------------------------------------------
# Presets. Physical numbers cite nccl-cost-model.md; graph values follow derive_graph unless pinned.
# -------------------------------------------------------------------------------------------------
_H100_NVL = IntraLink(kind="nvlink", bw_gbps=450.0, latency_us=0.8, nvls=True)   # §4.1: line 450 GB/s
_H800_NVL = IntraLink(kind="nvlink", bw_gbps=200.0, latency_us=0.8, nvls=True)   # §4.2: H800 200 GB/s
_A100_NVL = IntraLink(kind="nvlink", bw_gbps=300.0, latency_us=0.9, nvls=False)  # 12 NVLink3 x 25 GB/s
_IB400x8 = InterNet(kind="ib", nic_bw_gbps=50.0, latency_us=4.0, nics_per_node=8)   # 8 x NDR 400G
_IB200x8 = InterNet(kind="ib", nic_bw_gbps=25.0, latency_us=4.0, nics_per_node=8)   # 8 x HDR 200G
_IB200x4 = InterNet(kind="ib", nic_bw_gbps=25.0, latency_us=4.0, nics_per_node=4)

_PRESETS: dict[str, Topology] = {
    "h100-1x8": Topology(
        "h100-1x8", 1, 8, "hopper", _H100_NVL,
        description="1 node x 8 H100 SXM (NVSwitch, NVLS); nccl-tests#212 anchors."),
    "h800-1x8": Topology(
        "h800-1x8", 1, 8, "hopper", _H800_NVL,
        description="1 node x 8 H800 (reduced NVLink, 200 GB/s); nccl#1374."),
    "a100-1x8": Topology(
        "a100-1x8", 1, 8, "ampere", _A100_NVL,
        description="DGX A100, 8 x A100 SXM4 over NVSwitch; nccl-tests#149/#178."),
    "h100-2x8": Topology(
        "h100-2x8", 2, 8, "hopper", _H100_NVL, _IB400x8,
        description="7B model: 2 nodes x 8 H100, 8 x 400G IB per node, TP=8 (intra) / DP=2."),
    "h100-4x8": Topology(
        "h100-4x8", 4, 8, "hopper", _H100_NVL, _IB400x8,
        description="4 nodes x 8 H100, 8 x 400G IB; reference §2 (b); nccl#1222, nccl-tests#309."),
    "h100-8x8": Topology(
        "h100-8x8", 8, 8, "hopper", _H100_NVL, _IB400x8,
        description="70B model, FSDP over 64 ranks: 8 nodes x 8 H100, 8 x 400G IB."),
    "a100-2x8": Topology(
        "a100-2x8", 2, 8, "ampere", _A100_NVL, _IB200x8,
        description="2 x DGX A100, 8 x 200G IB; reference §2 (d); nccl#812."),
    "a100-2x8-4nic": Topology(
        "a100-2x8-4nic", 2, 8, "ampere", _A100_NVL, _IB200x4,
        description="2 x HGX A100, 4 x 200G IB; nccl-tests#119 / #100."),
    "h100-5x8-roce": Topology(
        "h100-5x8-roce", 5, 8, "hopper", _H100_NVL,
        InterNet(kind="roce", nic_bw_gbps=50.0, latency_us=6.0, nics_per_node=4),
        description="5 nodes x 8 H100, 4 x 400G RoCE; nccl#1368."),
    "h100-2x1-roce": Topology(
        "h100-2x1-roce", 2, 1, "hopper", _H100_NVL,
        InterNet(kind="roce", nic_bw_gbps=50.0, latency_us=3.0, nics_per_node=4),
        description="2 nodes x 1 H100, RoCE; nccl-tests#232. NIC speeds are not stated there; the 41.3 GB/s "
                    "plateau is one 400G NIC's worth, which is what one GPU drives (nics_used = 1)."),
    "a100-1x2": Topology(
        "a100-1x2", 1, 2, "ampere", _A100_NVL,
        description="2 x A100 over NVLink; small-message latency anchor nccl#583 (32 B AllReduce ~10.1 us)."),
    "p5en-2x8": Topology(
        "p5en-2x8", 2, 8, "hopper", _H100_NVL,
        # 16 x 200G EFA per node = 2 rails x 25 GiB/s per GPU (AWS model, §8.4); plugin latency 35 µs (§1.2);
        # one-way latency 18 µs = AWS's measured 2-node 8 B RDMA-write-with-immediate (§8.4 net_lat).
        InterNet(kind="efa", nic_bw_gbps=50.0, latency_us=18.0, nics_per_node=8, plugin_latency_us=35.0),
        cpu_vendor="intel",   # p5en.48xlarge: 4th-gen Intel Xeon (Sapphire Rapids)
        description="AWS p5en (H200 ~ Hopper), 2 nodes x 8, EFAv3, Intel hosts; AWS region tuner data §4.5."),
    "p5-2x8": Topology(
        "p5-2x8", 2, 8, "hopper", _H100_NVL,
        # 32 x 100G EFA per node = 4 rails x 12.5 GiB/s per GPU (§8.4); plugin latency 75 µs (§1.2);
        # one-way latency 20 µs = AWS's measured net_lat for P5 (§8.4).
        # ll_crossing_us FITTED (not a sourced figure): AWS measured no LL region on p5 at any size or rank count
        # (§4.5); NCCL's AMD figures (llMaxBw 22.5 GB/s, netOverhead 2 µs) leave Tree/LL best below 215 KiB at
        # 16 ranks. Reading: host-staged LL (send buffer in host memory, proxy polls every line's flag) costs
        # more per network crossing on these AMD hosts. Fitted on the 16-rank AllReduce region only (>= 10.5 µs
        # needed; smallest value on a 2-µs grid that reaches the best 16-rank agreement: 12); held-out check:
        # p5 AllReduce at 32 / 64 ranks 51 -> 85 % / 46 -> 82 % of sizes agree (dynamiccl/harness/simulator/aws_regions.py).
        InterNet(kind="efa", nic_bw_gbps=50.0, latency_us=20.0, nics_per_node=8, plugin_latency_us=75.0,
                 ll_crossing_us=12.0),
        cpu_vendor="amd",     # p5.48xlarge: 3rd-gen AMD EPYC (Milan, 7R13)
        description="AWS p5 (H100), 2 nodes x 8, EFAv2, AMD hosts; AWS region tuner data §4.5."),
}


def preset_names() -> tuple[str, ...]:
    return tuple(_PRESETS)


def preset(name: str) -> Topology:
    """Return a validated preset by name (see :func:`preset_names`)."""
    try:
        return _PRESETS[name].validate()
    except KeyError:
        raise KeyError(f"unknown topology preset {name!r}; known: {', '.join(_PRESETS)}") from None


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(names)}")
    return cls(**data)


def from_dict(data: Mapping[str, Any]) -> Topology:
    """Build a topology from a mapping; ``preset: NAME`` starts from a preset and overrides keys.

    >>> t = from_dict({"preset": "h100-2x8", "nodes": 4, "inter": {"kind": "roce", "latency_us": 6.0}})
    >>> t.n_ranks, t.inter.kind, t.inter.nic_bw_gbps
    (32, 'roce', 50.0)
    """
    data = dict(data)
    base = preset(data.pop("preset")) if "preset" in data else None
    kw: dict[str, Any] = {}
    for key, cls in (("intra", IntraLink), ("inter", InterNet), ("graph", GraphParams)):
        if key in data:
            sub = data.pop(key)
            if sub is None:
                kw[key] = None
                continue
            if not isinstance(sub, Mapping):
                raise ValueError(f"{key} must be a mapping")
            old = getattr(base, key) if base is not None else None
            merged = {**(dataclasses.asdict(old) if old is not None else {}), **sub}
            kw[key] = _build(cls, merged, key)
    if base is not None:
        kw = {**{f.name: getattr(base, f.name) for f in dataclasses.fields(Topology)}, **kw}
        if "name" not in data:
            kw["name"] = f"{base.name}+custom"
    kw.update(data)
    return _build(Topology, kw, "topology").validate()


def load_yaml(path: str | Path) -> Topology:
    """Load a topology from a YAML file (same keys as :func:`from_dict`)."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: top level must be a mapping")
    return from_dict(data)


def log2i(x: int) -> int:
    """NCCL's ``log2i``: floor(log2(x)) for x > 0, else -1."""
    return int(math.floor(math.log2(x))) if x > 0 else -1
