"""Calibration of the performance model against published NCCL numbers.

Every point below is copied from ``/work/shared/reference/nccl-cost-model.md`` (section given per row) with the
primary source it cites. For each point the simulator runs what the published run ran: NCCL's default choice
from :mod:`dynamiccl.harness.simulator.cost_model` (channels and chunk included), or the forced algorithm/protocol when the source
forced one (``NCCL_ALGO=...``), and evaluates :func:`dynamiccl.harness.simulator.perf_model.expected_time`.

Run ``python -m dynamiccl.harness.simulator.calibration`` for the table; ``--readme`` rewrites the table in
``dynamiccl/harness/simulator/README.md`` between its markers.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynamiccl.harness.simulator.cost_model import ALGOS, PROTOS, NcclModel, algo_index, proto_index
from dynamiccl.harness.simulator.perf_model import busbw, expected_time
from dynamiccl.harness.simulator.topology import preset

__all__ = ["CalPoint", "POINTS", "FLIP_TARGETS", "FLIP_GRID", "evaluate", "format_table", "flip_sizes", "nccl_flip_sizes",
           "flip_agreement", "TOLERANCE"]

TOLERANCE = 0.15
KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3


@dataclass(frozen=True)
class CalPoint:
    topology: str
    nbytes: int
    published: float
    source: str
    section: str
    algo: str | None = None      # forced in the published run
    proto: str | None = None
    unit: str = "busbw GB/s"     # or "time us"
    func: str = "AllReduce"
    note: str = ""


# Sizes not stated by a source are taken at 8 GiB ("large message" plateau) unless noted.
POINTS: tuple[CalPoint, ...] = (
    CalPoint("h100-1x8", 8 * GiB, 370.0, "nccl-tests#212", "§4.1, §4.2", "RING", "SIMPLE"),
    CalPoint("h100-1x8", 8 * GiB, 480.0, "nccl-tests#212, #309", "§4.1, §4.2", note="NVLS peak"),
    CalPoint("h800-1x8", 8 * GiB, 215.0, "nccl#1374", "§4.2"),
    CalPoint("a100-1x8", 8 * GiB, 200.0, "nccl-tests#149", "§4.2"),
    CalPoint("a100-1x8", 8 * GiB, 208.0, "nccl-tests#178", "§4.2"),
    CalPoint("a100-1x2", 32, 10.1, "nccl#583", "§4.2", unit="time us", note="small-message latency"),
    CalPoint("h100-2x8", 8 * GiB, 470.0, "nccl-tests#309", "§4.3", note="2-node, above NIC speed"),
    CalPoint("h100-4x8", 1 * GiB, 385.4, "nccl#1222", "§4.3, §2 (b)"),
    CalPoint("h100-4x8", 16 * GiB, 391.1, "nccl#1222", "§4.3, §2 (b)"),
    CalPoint("h100-4x8", 8 * GiB, 365.8, "nccl-tests#309", "§4.3"),
    CalPoint("a100-2x8", 8 * GiB, 192.0, "nccl#812", "§4.1, §2 (d)"),
    CalPoint("a100-2x8-4nic", 128 * MiB, 96.1, "nccl-tests#119", "§4.3", note="95.7–96.5"),
    CalPoint("a100-2x8-4nic", 1 * GiB, 91.0, "nccl-tests#100", "§4.3"),
    CalPoint("h100-5x8-roce", 8 * GiB, 190.0, "nccl#1368", "§4.3, §5.2", "RING", "SIMPLE"),
    CalPoint("h100-5x8-roce", 8 * GiB, 150.0, "nccl#1368", "§4.3, §5.2", "TREE", "SIMPLE"),
    CalPoint("h100-2x1-roce", 2 * MiB, 18.5, "nccl-tests#232", "§4.3", "TREE", "SIMPLE"),
    CalPoint("h100-2x1-roce", 4 * MiB, 27.2, "nccl-tests#232", "§4.3", "TREE", "SIMPLE"),
    CalPoint("h100-2x1-roce", 8 * MiB, 36.2, "nccl-tests#232", "§4.3", "TREE", "SIMPLE"),
    CalPoint("h100-2x1-roce", 16 * MiB, 39.9, "nccl-tests#232", "§4.3", "TREE", "SIMPLE"),
    CalPoint("h100-2x1-roce", 32 * MiB, 41.3, "nccl-tests#232", "§4.3", "TREE", "SIMPLE"),
)

#: Published winner flips (AWS measured decision regions, §4.5; 16 ranks = 2 nodes x 8): for each topology,
#: (lower size, upper size, winner) bands. Used by tests/simulator/test_calibration.py.
FLIP_TARGETS: dict[str, tuple[tuple[int, int, str], ...]] = {
    "p5en-2x8": ((0, 192 * KiB, "TREE/LL"), (192 * KiB, int(12.5 * MiB), "TREE/LL128"),
                 (int(12.5 * MiB), int(28.5 * MiB), "RING/LL128"), (int(28.5 * MiB), 1 << 40, "NVLS_TREE/SIMPLE")),
    "p5-2x8": ((0, 30 * MiB, "TREE/LL128"), (30 * MiB, 1 << 40, "NVLS_TREE/SIMPLE")),
}


@dataclass(frozen=True)
class Row:
    point: CalPoint
    config: str
    modelled: float

    @property
    def rel_error(self) -> float:
        return (self.modelled - self.point.published) / self.point.published


def _run(p: CalPoint) -> Row:
    topo = preset(p.topology)
    model = NcclModel(topo)
    nb = np.array([p.nbytes], dtype=np.int64)
    if p.algo is None:
        r = model.cost_table(p.func, nb)
        a, pr, nch, ck = int(r.algo[0]), int(r.proto[0]), r.n_channels, r.chunk
    else:
        a, pr = algo_index(p.algo), proto_index(p.proto)
        nch, _ = model.algo_info(a, pr, nb)
        ck = model.chunk_size(p.func, a, pr, nb, nch)
    t = expected_time(topo, p.func, nb, a, pr, nch, ck)
    val = float(t[0]) if p.unit == "time us" else float(busbw(p.func, nb, t, topo.n_ranks)[0])
    cfg = f"{ALGOS[a]}/{PROTOS[pr]} ch={int(nch[0])}" + (" (forced)" if p.algo else "")
    return Row(p, cfg, val)


def evaluate(points: tuple[CalPoint, ...] = POINTS) -> list[Row]:
    return [_run(p) for p in points]


def _size(n: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit:
            return f"{n / unit:.3g} {name}"
    return f"{n} B"


def format_table(rows: list[Row]) -> str:
    lines = ["| topology | size | run (algo/proto, channels) | metric | published | modelled | error | source (reference §) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.point
        lines.append(f"| {p.topology} | {_size(p.nbytes)} | {r.config} | {p.unit} | {p.published:g} | "
                     f"{r.modelled:.1f} | {100 * r.rel_error:+.1f} % | {p.source} ({p.section}) |")
    worst = max(abs(r.rel_error) for r in rows)
    lines.append("")
    lines.append(f"{len(rows)} points, worst |error| {100 * worst:.1f} % (tolerance {100 * TOLERANCE:.0f} %).")
    return "\n".join(lines)


def flip_sizes(topology: str, sizes: np.ndarray | None = None) -> list[tuple[int, str]]:
    """(first size, winner) for each run of equal winners of the oracle (idle network)."""
    from dynamiccl.harness.simulator.oracle import best_configs

    sizes = np.array([2 ** k for k in range(10, 34)]) if sizes is None else sizes
    r = best_configs(preset(topology), "AllReduce", sizes)
    out: list[tuple[int, str]] = []
    for s, name in zip(sizes.tolist(), r.names()):
        if not out or out[-1][1] != name:
            out.append((s, name))
    return out


#: Sizes the flip table is evaluated at: 1 KiB .. 8 GiB in quarter-octave steps.
FLIP_GRID = np.array(sorted({int(2 ** (k / 4)) for k in range(4 * 10, 4 * 33 + 1)}))


def nccl_flip_sizes(topology: str, sizes: np.ndarray | None = None) -> list[tuple[int, str]]:
    """(first size, winner) runs of NCCL's own choice (:mod:`dynamiccl.harness.simulator.cost_model`, no tuner)."""
    sizes = FLIP_GRID if sizes is None else sizes
    out: list[tuple[int, str]] = []
    for s, name in zip(sizes.tolist(), NcclModel(preset(topology)).cost_table("AllReduce", sizes).choice_names()):
        if not out or out[-1][1] != name:
            out.append((s, name))
    return out


def _published_winner(topology: str, size: int) -> str:
    for lo, hi, name in FLIP_TARGETS[topology]:
        if lo <= size < hi:
            return name
    raise ValueError(f"no published band for {size} B on {topology}")


def _winner_at(runs: list[tuple[int, str]], size: int) -> str:
    return [name for s, name in runs if s <= size][-1]


def flip_agreement(topology: str, sizes: np.ndarray = FLIP_GRID) -> tuple[float, float]:
    """Share of ``sizes`` at which (the oracle's, NCCL's own) best (algo, proto) is the published winner."""
    mod, ncc = flip_sizes(topology, sizes), nccl_flip_sizes(topology, sizes)
    pub = [_published_winner(topology, int(s)) for s in sizes]
    return (float(np.mean([_winner_at(mod, int(s)) == w for s, w in zip(sizes, pub)])),
            float(np.mean([_winner_at(ncc, int(s)) == w for s, w in zip(sizes, pub)])))


def format_flips() -> str:
    lines = ["| topology | published winners (AWS regions, §4.5) | modelled winners (oracle, idle) "
             "| NCCL's own choice (cost model) | sizes agreeing: model / NCCL |", "|---|---|---|---|---|"]
    for topo, bands in FLIP_TARGETS.items():
        pub = "; ".join(f"{b[2]} ≥ {_size(b[0])}" if b[0] else f"{b[2]} from 0" for b in bands)
        mod = "; ".join(f"{w} ≥ {_size(s)}" for s, w in flip_sizes(topo, FLIP_GRID))
        ncc = "; ".join(f"{w} ≥ {_size(s)}" for s, w in nccl_flip_sizes(topo))
        a_mod, a_ncc = flip_agreement(topo)
        lines.append(f"| {topo} | {pub} | {mod} | {ncc} | {100 * a_mod:.0f} % / {100 * a_ncc:.0f} % |")
    lines.append("")
    lines.append(f"Agreement: share of the {FLIP_GRID.size} sizes {_size(int(FLIP_GRID[0]))} - "
                 f"{_size(int(FLIP_GRID[-1]))} (quarter octaves) whose winner is the published one.")
    return "\n".join(lines)


BEGIN, END = "<!-- calibration:begin -->", "<!-- calibration:end -->"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", action="store_true", help="rewrite the table in dynamiccl/harness/simulator/README.md")
    args = ap.parse_args(argv)
    from dynamiccl.harness.simulator.aws_regions import format_heldout

    text = (format_table(evaluate()) + "\n\nWinner flips:\n\n" + format_flips()
            + "\n\nHeld-out regions (AWS §4.5 regions the per-platform fit did not see; `python -m "
            "dynamiccl.harness.simulator.aws_regions`):\n\n" + format_heldout())
    print(text)
    if args.readme:
        path = Path(__file__).with_name("README.md")
        doc = path.read_text(encoding="utf-8")
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        block = f"{BEGIN}\n<!-- generated by `python -m dynamiccl.harness.simulator.calibration --readme`; do not edit -->\n\n{text}\n\n{END}"
        path.write_text(head + block + tail, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
