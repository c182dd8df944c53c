import numpy as np
import pytest

from simulator import calibration, perf_model
from simulator.calibration import FLIP_TARGETS, POINTS, TOLERANCE, evaluate, flip_sizes

MiB = 2 ** 20


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"{p.topology}-{p.nbytes}-{p.source}")
def test_published_point_within_tolerance(point):
    (row,) = evaluate((point,))
    assert abs(row.rel_error) <= TOLERANCE, f"{point}: modelled {row.modelled:.1f}"


def test_calibration_check_can_fail(monkeypatch):
    monkeypatch.setitem(perf_model.REAL, "nvls_eff", perf_model.REAL["nvls_eff"] * 0.7)
    rows = evaluate()
    assert any(abs(r.rel_error) > TOLERANCE for r in rows)


def test_readme_table_is_current():
    from pathlib import Path
    readme = Path(calibration.__file__).with_name("README.md").read_text(encoding="utf-8")
    assert calibration.format_table(evaluate()) in readme


def _winner_at(flips, size):
    w = None
    for s, name in flips:
        if s <= size:
            w = name
    return w


@pytest.mark.parametrize("topo", list(FLIP_TARGETS))
def test_large_message_winner_and_onset(topo):
    # AWS measured regions (§4.5): NVLSTree/Simple wins above ~28.5–30 MiB at 16 ranks.
    lo = FLIP_TARGETS[topo][-1][0]
    sizes = np.array([int(2 ** (k / 4)) for k in range(4 * 20, 4 * 33)])
    flips = flip_sizes(topo, sizes)
    assert flips[-1][1] == "NVLS_TREE/SIMPLE"
    onset = flips[-1][0]
    assert lo / 2.5 <= onset <= lo * 2.5, f"onset {onset / MiB:.1f} MiB vs published {lo / MiB:.1f} MiB"


def _last_winning(flips, names, sizes):
    """Largest probed size at which one of ``names`` wins (0 if never)."""
    winners = [_winner_at(flips, int(x)) for x in sizes]
    hit = [int(x) for x, w in zip(sizes, winners) if w in names]
    return max(hit, default=0)


QUARTER = np.array(sorted({int(2 ** (k / 4)) for k in range(4 * 10, 4 * 27)}))
LL_CELLS = ("TREE/LL", "RING/LL")


def test_tree_ll_region_ends_near_the_published_size_p5en():
    # AWS p5en (§4.5): Tree/LL wins below 192 KiB at every communicator size. Before the host-staged LL
    # ceiling (perf_model REAL["ll_net_bus_gbps"]) the model kept Tree/LL best up to 8 MiB.
    flips = flip_sizes("p5en-2x8", QUARTER)
    assert _winner_at(flips, 64 * 1024) == "TREE/LL"
    end = _last_winning(flips, ("TREE/LL",), QUARTER)
    assert 192 * 1024 / 2.5 <= end <= 192 * 1024 * 2.5, f"Tree/LL wins up to {end / 1024:.0f} KiB"
    assert _last_winning(flips, LL_CELLS, QUARTER) < 2 * MiB


def test_amd_hosts_shrink_the_ll_region():
    # p5 (AMD Milan hosts) has no LL region at all in the AWS data, p5en (Intel) one below 192 KiB: LL is
    # the only protocol staged through host memory across nodes, so the host decides.
    p5 = _last_winning(flip_sizes("p5-2x8", QUARTER), LL_CELLS, QUARTER)
    p5en = _last_winning(flip_sizes("p5en-2x8", QUARTER), LL_CELLS, QUARTER)
    assert p5 < p5en


@pytest.mark.xfail(strict=True, reason=(
    "known deviation: between Tree/LL (< 362 KiB) and Tree/LL128 (>= 861 KiB) the model has a Ring/LL wedge; "
    "published (§4.5) Tree/LL128 wins from 192 KiB. At 512 KiB Ring/LL (95 us) beats Tree/LL128 (103 us) "
    "because the model charges Tree/LL128 a 14-hop NVLink + 1 network-hop pipeline fill with NCCL's "
    "18 000-B Tree/LL128 chunks (~25 us) and Ring none; removing it needs a finer LL128 forwarding grain than "
    "NCCL's 30 KB-per-warp register tiles support, i.e. a fitted knob"))
def test_small_message_protocol_flip_p5en():
    flips = flip_sizes("p5en-2x8")
    assert _winner_at(flips, 512 * 1024) == "TREE/LL128" and _winner_at(flips, 64 * 1024) == "TREE/LL"


@pytest.mark.xfail(strict=True, reason=(
    "known deviation: p5 (AMD hosts) has no LL region in the AWS data (§4.5); the model's AMD LL ceiling "
    "(NCCL's llMaxBw row: 22.5 GB/s) shortens LL to < 362 KiB but cannot remove it: at 1-64 KiB LL's lower "
    "per-hop latency (NCCL hwLat) wins, and no source gives an extra per-crossing latency for host-staged LL "
    "on AMD large enough (>= ~10 us per crossing; Tree/LL 63 us vs Tree/LL128 83 us at 1 KiB) to invert that"))
def test_no_ll_region_p5():
    flips = flip_sizes("p5-2x8")
    assert not any(name in LL_CELLS for _, name in flips)


@pytest.mark.xfail(strict=True, reason=(
    "known deviation: the narrow Ring/LL128 band (12.5-28.5 MiB at 16 ranks, p5en) is not reproduced: a 2-node "
    "tree sends half the bytes through the NICs (nccl#946), so once NCCL's Tree/LL128 chunk stops shrinking "
    "(>= ~8 MiB) Tree/LL128 beats Ring/LL128 at every size in the model. NCCL's own model gets the band from "
    "its per-channel Tree/LL128 cap and tree correction factor, which have no physical counterpart here. AWS "
    "itself calls its <= 2-node regions 'not well defined' (the region tuner skips them) and moved these "
    "16-rank edges between releases (14 -> 12.5 MiB, 32 -> 28.5 MiB)"))
def test_ring_ll128_band_p5en():
    assert _winner_at(flip_sizes("p5en-2x8"), 20 * MiB) == "RING/LL128"
