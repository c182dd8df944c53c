"""AWS's measured winner regions (reference §4.5) at 16, 32 and 64 ranks, and a scorer for the model's winners.

The aws-ofi-nccl region tuner (``src/tuner/nccl_ofi_regions.cpp``, 8 ranks per node) stores, per platform and
collective, polygons in the (log2 bytes, log2 nRanks) plane, each labelled with the (algo, proto) measured best
inside it. Here each region is written as a size band between two of its polygon edges; an edge is the list of
its vertices ``(bytes, nRanks)`` and is log2-interpolated between them, as the tuner does. A band applies at a
communicator size only where both of its edges are defined there; sizes that fall in no band (gaps between the
polygons, where the tuner leaves NCCL's choice standing) are not scored.

The 16-rank AllReduce bands are the ones :data:`dynamiccl.harness.simulator.calibration.FLIP_TARGETS` holds; the 32- and 64-rank
bands and every AllGather/ReduceScatter band are *held out* from the per-platform fit in
:mod:`dynamiccl.harness.simulator.topology` (``InterNet.ll_crossing_us`` etc.) and serve to check it.

>>> published_bands("p5en", "AllReduce", 32)[1]
('TREE/LL128', 196608, 28206615)
>>> published_winner("p5", "AllReduce", 64, 2 ** 20)
'TREE/LL128'
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys

import numpy as np

from dynamiccl.harness.simulator.calibration import FLIP_GRID, _size
from dynamiccl.harness.simulator.oracle import best_configs
from dynamiccl.harness.simulator.topology import Topology, preset

__all__ = ["REGIONS", "PLATFORMS", "HELD_OUT", "FITTED", "published_bands", "published_winner", "topology_for",
           "agreement", "with_fit", "heldout_scores", "mean_agreement", "format_heldout", "fit", "search", "main"]

INF = math.inf
Edge = float | tuple[tuple[float, int], ...]

#: platform -> preset at 2 nodes x 8 GPUs (more nodes: :func:`topology_for`).
PLATFORMS = {"p5en": "p5en-2x8", "p5": "p5-2x8"}

# (winner, lower edge, upper edge) in the order the tuner tests its polygons. Vertices copied from
# aws-ofi-nccl src/tuner/nccl_ofi_regions.cpp (region_init_internal_p5en / _p5_p5e, nRanks == 8 * nNodes).
_P5EN_AR_T128 = ((13107200, 16), (129499136, 127), (218103808, 1024))
_P5EN_AR_R128 = ((29884416, 16), (293601280, 32), (589299712, 64), (549453824, 128))
_P5EN_AR_NVLS = ((INF, 16), (509607936, 32), (7516192768, 256), (17179869184, 448))
_P5EN_AG_LL = ((786432, 16), (4718592, 128), (13630464, 384))
_P5EN_AG_R128 = ((236978176, 16), (956301312, 64), (7247754240, 384))
_P5EN_AG_RS = ((236978176, 16), (494927872, 32), (956301312, 64), (7247754240, 384))
_P5EN_RS_LL = ((786432, 16), (4718592, 128), (7340032, 256))
_P5EN_RS_R128 = ((291504128, 16), (589299712, 32), (2415919104, 128))
_P5_AR_T128 = ((31457280, 16), (37748736, 32), (117440512, 64), (301989888, 128))
_P5_AR_R128_LO = ((31457280, 17), (37748736, 32), (117440512, 64), (301989888, 128))
_P5_AR_R128_HI = ((1073741824, 17), (2147483648, 64), (2147483648, 128))
_P5_AR_RS_LO = ((1073741824, 17), (1610612736, 32), (2684354560, 64), (8053063680, 160))

REGIONS: dict[tuple[str, str], tuple[tuple[str, Edge, Edge], ...]] = {
    ("p5en", "AllReduce"): (
        ("TREE/LL", 0, 196608),
        ("TREE/LL128", 196608, _P5EN_AR_T128),
        ("RING/LL128", _P5EN_AR_T128, _P5EN_AR_R128),
        ("NVLS_TREE/SIMPLE", _P5EN_AR_R128, _P5EN_AR_NVLS),
        ("RING/SIMPLE", _P5EN_AR_NVLS, INF)),
    ("p5en", "AllGather"): (
        ("RING/LL", 0, _P5EN_AG_LL),
        ("RING/LL128", _P5EN_AG_LL, _P5EN_AG_R128),
        ("RING/SIMPLE", _P5EN_AG_RS, INF)),
    ("p5en", "ReduceScatter"): (
        ("RING/LL", 0, _P5EN_RS_LL),
        ("RING/LL128", _P5EN_RS_LL, _P5EN_RS_R128),
        ("RING/SIMPLE", _P5EN_RS_R128, INF)),
    ("p5", "AllReduce"): (
        ("TREE/LL128", 0, _P5_AR_T128),
        ("NVLS_TREE/SIMPLE", ((31457280, 16),), ((INF, 16),)),     # only at exactly 16 ranks
        ("RING/LL128", _P5_AR_R128_LO, _P5_AR_R128_HI),
        ("RING/SIMPLE", _P5_AR_RS_LO, INF)),
}


def _edge_at(edge: Edge, n_ranks: int) -> float | None:
    """Bytes of ``edge`` at ``n_ranks`` (log2-interpolated between vertices), ``None`` outside its ranks."""
    if not isinstance(edge, tuple):
        return float(edge)
    y = math.log2(n_ranks)
    for (b0, r0), (b1, r1) in zip(edge, edge[1:] or edge):
        y0, y1 = math.log2(r0), math.log2(r1)
        if y0 <= y <= y1:
            if math.isinf(b0) or math.isinf(b1) or y1 == y0:
                return float(b0 if y == y0 else b1)
            x = math.log2(b0) + (y - y0) / (y1 - y0) * (math.log2(b1) - math.log2(b0))
            return 2.0 ** x
    return None


def published_bands(platform: str, func: str, n_ranks: int) -> list[tuple[str, float, float]]:
    """(winner, lower bytes, upper bytes) of the regions defined at ``n_ranks`` (8 ranks per node)."""
    try:
        regions = REGIONS[(platform, func)]
    except KeyError:
        raise KeyError(f"no published regions for {platform} {func}; known: {sorted(REGIONS)}") from None
    out = []
    for name, lo, hi in regions:
        a, b = _edge_at(lo, n_ranks), _edge_at(hi, n_ranks)
        if a is not None and b is not None and a < b:
            out.append((name, round(a) if math.isfinite(a) else a, round(b) if math.isfinite(b) else b))
    return out


def published_winner(platform: str, func: str, n_ranks: int, nbytes: int) -> str | None:
    """The measured winner at (``nbytes``, ``n_ranks``), ``None`` where no region covers it."""
    for name, lo, hi in published_bands(platform, func, n_ranks):
        if lo <= nbytes < hi:
            return name
    return None


def topology_for(platform: str, nodes: int) -> Topology:
    """The platform's preset with ``nodes`` nodes of 8 GPUs (everything else unchanged)."""
    base = preset(PLATFORMS[platform])
    return dataclasses.replace(base, nodes=nodes, name=f"{platform}-{nodes}x8").validate()


def agreement(platform: str, func: str, nodes: int, sizes: np.ndarray = FLIP_GRID,
              topology: Topology | None = None) -> tuple[float, int]:
    """(share of scored sizes whose modelled winner (oracle, idle) is the published one, sizes scored)."""
    topo = topology or topology_for(platform, nodes)
    pub = [published_winner(platform, func, topo.n_ranks, int(s)) for s in sizes]
    keep = np.array([w is not None for w in pub])
    if not keep.any():
        raise ValueError(f"no published region covers {platform} {func} at {topo.n_ranks} ranks")
    names = best_configs(topo, func, np.asarray(sizes)[keep]).names()
    hits = [m == w for m, w in zip(names, (w for w in pub if w is not None))]
    return float(np.mean(hits)), int(keep.sum())


#: (platform, func, nodes) scored by :func:`heldout_scores`: everything except the 16-rank AllReduce fit data.
HELD_OUT = tuple((p, f, n) for p, funcs in (("p5en", ("AllReduce", "AllGather", "ReduceScatter")),
                                            ("p5", ("AllReduce",)))
                 for f in funcs for n in (2, 4, 8) if not (f == "AllReduce" and n == 2))

#: The per-platform fitted fields of :class:`dynamiccl.harness.simulator.topology.InterNet`, their neutral values and the grid
#: :func:`search` fits them on.
FITTED = {"ll_crossing_us": 0.0, "tree_ll128_eff": 1.0, "nvls_tree_extra_us": 0.0}
GRID = {"ll_crossing_us": (0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0),
        "tree_ll128_eff": (1.0, 0.9, 0.8, 0.7, 0.6, 0.5),
        "nvls_tree_extra_us": (0.0, 10.0, 20.0, 30.0, 40.0, 60.0, 80.0)}


def with_fit(topology: Topology, **fit: float) -> Topology:
    """``topology`` with its fitted ``InterNet`` fields set (unnamed ones neutral): ``with_fit(t)`` = unfitted."""
    unknown = set(fit) - set(FITTED)
    if unknown:
        raise ValueError(f"unknown fitted field(s) {sorted(unknown)}; known: {sorted(FITTED)}")
    return dataclasses.replace(topology, inter=dataclasses.replace(topology.inter, **{**FITTED, **fit})).validate()


def heldout_scores(topology_of=topology_for) -> dict[tuple[str, str, int], tuple[float, int]]:
    """Agreement per held-out (platform, func, nodes); ``topology_of(platform, nodes)`` builds the topology."""
    return {k: agreement(k[0], k[1], k[2], topology=topology_of(k[0], k[2])) for k in HELD_OUT}


def mean_agreement(scores: dict[tuple[str, str, int], tuple[float, int]], platform: str | None = None) -> float:
    """Share of all scored sizes that agree (of ``platform``'s entries, or of all)."""
    rows = [v for k, v in scores.items() if platform is None or k[0] == platform]
    return sum(a * k for a, k in rows) / sum(k for _, k in rows)


def format_heldout() -> str:
    """Markdown: agreement on the held-out regions, presets as fitted vs with their fitted fields neutral."""
    fitted = heldout_scores()
    unfit = heldout_scores(lambda p, n: with_fit(topology_for(p, n)))
    fit16 = {p: agreement(p, "AllReduce", 2)[0] for p in PLATFORMS}
    unfit16 = {p: agreement(p, "AllReduce", 2, topology=with_fit(topology_for(p, 2)))[0] for p in PLATFORMS}
    lines = ["| platform | collective | ranks | sizes scored | agreement unfitted | agreement as fitted |",
             "|---|---|---|---|---|---|"]
    for p in PLATFORMS:
        lines.append(f"| {p} | AllReduce (fit data) | 16 | {FLIP_GRID.size} | {100 * unfit16[p]:.0f} % | "
                     f"{100 * fit16[p]:.0f} % |")
    for k, (a, n) in fitted.items():
        lines.append(f"| {k[0]} | {k[1]} | {8 * k[2]} | {n} | {100 * unfit[k][0]:.0f} % | {100 * a:.0f} % |")
    lines.append(f"| all held-out | | | {sum(n for _, n in fitted.values())} | {100 * mean_agreement(unfit):.1f} % | "
                 f"{100 * mean_agreement(fitted):.1f} % |")
    return "\n".join(lines)


def fit(platform: str, fields: tuple[str, ...]) -> dict[str, float]:
    """Values of ``fields`` on :data:`GRID` that maximise the 16-rank AllReduce agreement of ``platform``
    (the only data the fit sees); ties go to the fewest non-neutral fields, then the values nearest neutral."""
    base = topology_for(platform, 2)
    best: tuple | None = None
    for vals in itertools.product(*(GRID[f] for f in fields)):
        kw = dict(zip(fields, vals))
        a16, _ = agreement(platform, "AllReduce", 2, topology=with_fit(base, **kw))
        span = {f: max(GRID[f]) - min(GRID[f]) for f in fields}
        key = (-a16, sum(kw[f] != FITTED[f] for f in fields), sum(abs(kw[f] - FITTED[f]) / span[f] for f in fields))
        if best is None or key < best[0]:
            best = (key, kw)
    return best[1]


def search() -> str:
    """Fit every single field and every pair per platform on 16 ranks; score each fit on the held-out regions."""
    lines = ["| platform | fitted (16-rank AllReduce only) | 16-rank agreement | held-out agreement (this platform) |",
             "|---|---|---|---|"]
    for platform in PLATFORMS:
        unfit = lambda p, n: with_fit(topology_for(p, n))          # noqa: E731
        a16 = agreement(platform, "AllReduce", 2, topology=unfit(platform, 2))[0]
        held = mean_agreement(heldout_scores(unfit), platform)
        lines.append(f"| {platform} | nothing | {100 * a16:.1f} % | {100 * held:.1f} % |")
        combos = [(f,) for f in FITTED] + list(itertools.combinations(FITTED, 2))
        for fields in combos:
            kw = fit(platform, fields)
            mk = lambda p, n, kw=kw: with_fit(topology_for(p, n), **(kw if p == platform else {}))   # noqa: E731
            a16 = agreement(platform, "AllReduce", 2, topology=mk(platform, 2))[0]
            held = mean_agreement({k: v for k, v in heldout_scores(mk).items() if k[0] == platform})
            txt = ", ".join(f"{f}={v:g}" for f, v in kw.items())
            lines.append(f"| {platform} | {txt} | {100 * a16:.1f} % | {100 * held:.1f} % |")
    return "\n".join(lines)


def runs(topology: Topology, func: str, sizes: np.ndarray = FLIP_GRID) -> str:
    out: list[tuple[int, str]] = []
    for s, name in zip(sizes.tolist(), best_configs(topology, func, sizes).names()):
        if not out or out[-1][1] != name:
            out.append((s, name))
    return "; ".join(f"{w} ≥ {_size(s)}" for s, w in out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", action="store_true", help="also print the published and modelled winner runs")
    ap.add_argument("--search", action="store_true",
                    help="refit the per-platform fields on 16 ranks and score every candidate on the held-out regions")
    args = ap.parse_args(argv)
    print(format_heldout())
    if args.runs:
        for p, f, n in tuple((p, "AllReduce", 2) for p in PLATFORMS) + HELD_OUT:
            pub = "; ".join(f"{w} {_size(int(lo))}-{_size(int(hi)) if math.isfinite(hi) else '∞'}"
                            for w, lo, hi in published_bands(p, f, 8 * n))
            print(f"{p} {f} {8 * n} ranks\n  published: {pub}\n  modelled:  {runs(topology_for(p, n), f)}")
    if args.search:
        print()
        print(search())
    return 0


if __name__ == "__main__":
    sys.exit(main())
