"""Training workloads: which collectives each rank issues per training step, on which communicators.

A :class:`Workload` names a topology preset, a set of communicator *groups* and a step schedule:

* a **group** is a family of communicators that partition (some of) the global ranks the same way:
  ``layout: block`` (contiguous blocks of ``size`` ranks: tensor parallel inside a node), ``layout: stride``
  (ranks ``i, i+k, i+2k, …`` with ``k = n_ranks / size``: data parallel across nodes, one comm per local
  index), ``layout: world`` (one comm of all ranks) or explicit ``ranks: [[…], […]]``. Global rank ``r``
  lives on node ``r // gpus_per_node``. Every comm of a group gets its own comm hash and name (``tp0``, ``tp1``…).
* the **schedule** is a list of blocks ``{repeat: N, ops: [...]}``; an op is
  ``{group, func, bytes, compute_us, src?}``. ``bytes`` is NCCL's ``nBytes`` (what the tuner sees): the whole
  buffer for AllReduce/Broadcast/Reduce, the *full* (gathered) buffer for AllGather/ReduceScatter, the message
  for Send. ``compute_us`` is the compute each participating rank does before issuing the op, so simulated
  time advances like a real step; ``step_gap_us`` is added at the end of every step (optimizer, data loader).
  ``func: Send`` needs a group of 2-rank comms: member ``src`` sends, the other member records a Recv.

Every op of a schedule slot runs on *all* comms of its group at once (all TP groups do their all-reduce
together), which is how data/tensor/pipeline parallel training behaves.

>>> w = preset("small")
>>> w.topology.name, [g.name for g in w.groups], w.n_slots, w.records_per_step
('h100-2x8', ['tp', 'dp', 'world', 'pp'], 8, 128)
>>> w.groups[1].comms[0].ranks, w.groups[1].comms[0].nodes
((0, 8), (0, 1))
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from dynamiccl.collector.wire_format import DATATYPE_SIZES, DATATYPES
from dynamiccl.harness.simulator.topology import Topology
from dynamiccl.harness.simulator.topology import from_dict as topology_from_dict
from dynamiccl.harness.simulator.topology import preset as topology_preset

__all__ = ["Comm", "CommGroup", "Op", "Workload", "WorkloadError", "COLL_FUNCS", "P2P_FUNCS",
           "preset", "preset_names", "from_dict", "load_yaml", "load"]

COLL_FUNCS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce")
P2P_FUNCS = ("Send",)
LAYOUTS = ("block", "stride", "world")
WORKLOAD_DIR = Path(__file__).with_name("workloads")


class WorkloadError(ValueError):
    """A workload description is invalid; the message names the offending field."""


@dataclass(frozen=True)
class Comm:
    """One communicator: ``ranks`` are global ranks in communicator-rank order."""

    name: str
    comm_hash: int
    ranks: tuple[int, ...]
    nodes: tuple[int, ...]      # distinct nodes, sorted
    gpus_per_node: int          # ranks of this comm on each of its nodes (uniform)

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class CommGroup:
    name: str
    comms: tuple[Comm, ...]

    @property
    def size(self) -> int:
        return self.comms[0].n_ranks

    def members(self) -> np.ndarray:
        """(n_comms, size) global ranks."""
        return np.array([c.ranks for c in self.comms], dtype=np.int64)


@dataclass(frozen=True)
class Op:
    group: str
    func: str
    bytes: int
    compute_us: float = 0.0
    src: int = 0


@dataclass(frozen=True)
class Workload:
    name: str
    topology: Topology
    groups: tuple[CommGroup, ...]
    schedule: tuple[Op, ...]          # flattened: one entry per slot of a step
    dtype: str = "ncclBfloat16"
    step_gap_us: float = 0.0
    arrival_jitter_us: float = 2.0
    description: str = ""
    _group_index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._group_index.update({g.name: i for i, g in enumerate(self.groups)})

    def group(self, name: str) -> CommGroup:
        return self.groups[self._group_index[name]]

    def group_id(self, name: str) -> int:
        return self._group_index[name]

    @property
    def n_slots(self) -> int:
        return len(self.schedule)

    @property
    def comms(self) -> tuple[Comm, ...]:
        return tuple(c for g in self.groups for c in g.comms)

    @property
    def records_per_step(self) -> int:
        """Per-rank operation records one step produces (all ranks)."""
        return sum(len(self.group(op.group).comms) * self.group(op.group).size for op in self.schedule)

    @property
    def dtype_size(self) -> int:
        return DATATYPE_SIZES[DATATYPES.index(self.dtype)]

    def nominal_step_compute_us(self) -> float:
        return float(sum(op.compute_us for op in self.schedule) + self.step_gap_us)


# ------------------------------------------------------------------------------------------------
# building and validation
# ------------------------------------------------------------------------------------------------
def comm_hash(workload: str, comm: str) -> int:
    """Stable 64-bit communicator id (NCCL's ``commId`` hash stand-in); never 0."""
    h = int.from_bytes(hashlib.blake2b(f"{workload}/{comm}".encode(), digest_size=8).digest(), "little")
    return h or 1


def _make_comm(workload: str, name: str, ranks: Sequence[int], topo: Topology, where: str) -> Comm:
    ppn = topo.gpus_per_node
    ranks = tuple(int(r) for r in ranks)
    if len(ranks) < 2:
        raise WorkloadError(f"{where}: a communicator needs at least 2 ranks, got {list(ranks)}")
    if len(set(ranks)) != len(ranks):
        raise WorkloadError(f"{where}: duplicate ranks in {list(ranks)}")
    bad = [r for r in ranks if not 0 <= r < topo.n_ranks]
    if bad:
        raise WorkloadError(f"{where}: ranks {bad} outside [0, {topo.n_ranks}) of topology {topo.name}")
    nodes = [r // ppn for r in ranks]
    per_node = {n: nodes.count(n) for n in nodes}
    if len(set(per_node.values())) != 1:
        raise WorkloadError(f"{where}: ranks must be spread evenly over nodes (got {per_node} ranks per node)")
    return Comm(name, comm_hash(workload, name), ranks, tuple(sorted(per_node)), next(iter(per_node.values())))


def _group(workload: str, data: Mapping[str, Any], topo: Topology, where: str) -> CommGroup:
    _check_keys(data, {"name", "layout", "size", "ranks"}, where)
    name = data.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise WorkloadError(f"{where}.name must be an identifier string, got {name!r}")
    n = topo.n_ranks
    if "ranks" in data:
        if "layout" in data or "size" in data:
            raise WorkloadError(f"{where}: give either ranks or layout/size, not both")
        lists = data["ranks"]
        if not isinstance(lists, list) or not lists or not all(isinstance(x, list) for x in lists):
            raise WorkloadError(f"{where}.ranks must be a non-empty list of rank lists")
    else:
        layout = data.get("layout")
        if layout not in LAYOUTS:
            raise WorkloadError(f"{where}.layout must be one of {LAYOUTS}, got {layout!r}")
        size = n if layout == "world" else data.get("size")
        if not isinstance(size, int) or size < 2 or n % size:
            raise WorkloadError(f"{where}.size must be an int >= 2 dividing n_ranks={n}, got {size!r}")
        k = n // size
        if layout == "stride":
            lists = [[i + j * k for j in range(size)] for i in range(k)]
        else:
            lists = [list(range(b * size, (b + 1) * size)) for b in range(k)]
    comms = tuple(_make_comm(workload, f"{name}{i}", rs, topo, f"{where}.ranks[{i}]") for i, rs in enumerate(lists))
    sizes = {c.n_ranks for c in comms}
    if len(sizes) != 1:
        raise WorkloadError(f"{where}: all comms of a group must have the same size, got {sorted(sizes)}")
    used = [r for c in comms for r in c.ranks]
    if len(set(used)) != len(used):
        raise WorkloadError(f"{where}: comms of one group must not share ranks")
    return CommGroup(name, comms)


def _check_keys(data: Any, allowed: set[str], where: str) -> None:
    if not isinstance(data, Mapping):
        raise WorkloadError(f"{where} must be a mapping, got {type(data).__name__}")
    unknown = set(data) - allowed
    if unknown:
        raise WorkloadError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")


def _op(data: Mapping[str, Any], groups: dict[str, CommGroup], dsize: int, where: str) -> Op:
    _check_keys(data, {"group", "func", "bytes", "compute_us", "src"}, where)
    g = data.get("group")
    if g not in groups:
        raise WorkloadError(f"{where}.group must name a group in {sorted(groups)}, got {g!r}")
    func = data.get("func")
    if func not in COLL_FUNCS + P2P_FUNCS:
        raise WorkloadError(f"{where}.func must be one of {COLL_FUNCS + P2P_FUNCS}, got {func!r}")
    nb = data.get("bytes")
    if not isinstance(nb, int) or isinstance(nb, bool) or nb <= 0:
        raise WorkloadError(f"{where}.bytes must be a positive int, got {nb!r}")
    size = groups[g].size
    unit = dsize * (size if func in ("AllGather", "ReduceScatter") else 1)
    if nb % unit:
        raise WorkloadError(f"{where}.bytes={nb} must be a multiple of {unit} (dtype size"
                            + (f" x {size} ranks for {func})" if unit != dsize else ")"))
    cu = data.get("compute_us", 0.0)
    if not isinstance(cu, (int, float)) or isinstance(cu, bool) or cu < 0:
        raise WorkloadError(f"{where}.compute_us must be a number >= 0, got {cu!r}")
    src = data.get("src", 0)
    if func in P2P_FUNCS:
        if size != 2:
            raise WorkloadError(f"{where}: func Send needs a group of 2-rank comms; {g} has {size} ranks")
        if src not in (0, 1):
            raise WorkloadError(f"{where}.src must be 0 or 1 (member index of the sender), got {src!r}")
    elif "src" in data:
        raise WorkloadError(f"{where}.src is only valid for func Send")
    return Op(g, func, nb, float(cu), int(src))


def from_dict(data: Mapping[str, Any]) -> Workload:
    """Build and validate a workload. Errors name the field (``schedule[1].ops[0].bytes …``)."""
    _check_keys(data, {"name", "topology", "dtype", "step_gap_us", "arrival_jitter_us", "groups",
                       "schedule", "description"}, "workload")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise WorkloadError(f"name must be a non-empty string, got {name!r}")
    topo_spec = data.get("topology")
    try:
        topo = topology_preset(topo_spec) if isinstance(topo_spec, str) else topology_from_dict(topo_spec or {})
    except (KeyError, ValueError, TypeError) as exc:
        raise WorkloadError(f"topology: {exc}") from None
    dtype = data.get("dtype", "ncclBfloat16")
    if dtype not in DATATYPES:
        raise WorkloadError(f"dtype must be one of {DATATYPES}, got {dtype!r}")
    dsize = DATATYPE_SIZES[DATATYPES.index(dtype)]
    for key in ("step_gap_us", "arrival_jitter_us"):
        v = data.get(key, 0.0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise WorkloadError(f"{key} must be a number >= 0, got {v!r}")
    gl = data.get("groups")
    if not isinstance(gl, list) or not gl:
        raise WorkloadError("groups must be a non-empty list")
    groups: dict[str, CommGroup] = {}
    for i, g in enumerate(gl):
        grp = _group(name, g, topo, f"groups[{i}]")
        if grp.name in groups:
            raise WorkloadError(f"groups[{i}].name {grp.name!r} is duplicated")
        groups[grp.name] = grp
    sched = data.get("schedule")
    if not isinstance(sched, list) or not sched:
        raise WorkloadError("schedule must be a non-empty list of {repeat, ops} blocks")
    slots: list[Op] = []
    for i, blk in enumerate(sched):
        _check_keys(blk, {"repeat", "ops"}, f"schedule[{i}]")
        rep = blk.get("repeat", 1)
        if not isinstance(rep, int) or isinstance(rep, bool) or rep < 1:
            raise WorkloadError(f"schedule[{i}].repeat must be an int >= 1, got {rep!r}")
        ops = blk.get("ops")
        if not isinstance(ops, list) or not ops:
            raise WorkloadError(f"schedule[{i}].ops must be a non-empty list")
        block = [_op(o, groups, dsize, f"schedule[{i}].ops[{j}]") for j, o in enumerate(ops)]
        slots.extend(block * rep)
    return Workload(name=name, topology=topo, groups=tuple(groups.values()), schedule=tuple(slots), dtype=dtype,
                    step_gap_us=float(data.get("step_gap_us", 0.0)),
                    arrival_jitter_us=float(data.get("arrival_jitter_us", 2.0)),
                    description=str(data.get("description", "")))


def load_yaml(path: str | Path, *, topology: str | Mapping[str, Any] | None = None) -> Workload:
    """Load a workload; ``topology`` (a preset name or mapping) replaces the file's."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, Mapping):
        raise WorkloadError(f"{path}: top level must be a mapping")
    if topology is not None:
        data = {**data, "topology": topology}
    try:
        return from_dict(data)
    except WorkloadError as exc:
        raise WorkloadError(f"{path}: {exc}") from None


def preset_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml")))


def preset(name: str, *, topology: str | Mapping[str, Any] | None = None) -> Workload:
    """A workload shipped in ``dynamiccl/harness/simulator/workloads/NAME.yaml``."""
    path = WORKLOAD_DIR / f"{name}.yaml"
    if not path.is_file():
        raise KeyError(f"unknown workload preset {name!r}; known: {', '.join(preset_names())}")
    return load_yaml(path, topology=topology)


def load(spec: str | Path, *, topology: str | Mapping[str, Any] | None = None) -> Workload:
    """A preset name or a path to a YAML file."""
    s = str(spec)
    if s.endswith((".yaml", ".yml")) or "/" in s:
        return load_yaml(s, topology=topology)
    return preset(s, topology=topology)
