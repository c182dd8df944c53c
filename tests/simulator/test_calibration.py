import numpy as np
import pytest

from dynamiccl.harness.simulator import calibration, perf_model
from dynamiccl.harness.simulator.calibration import FLIP_TARGETS, POINTS, TOLERANCE, evaluate, flip_sizes

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


def test_small_message_protocol_flip_p5en():
    # AWS p5en (§4.5): Tree/LL, then Tree/LL128 (from 192 KiB), no Ring/LL in between. The model had a Ring/LL
    # wedge (362-861 KiB) until multi-node Ring steps paid the proxy's per-step overhead (NCCL's netOverhead,
    # §1.1/§1.4) and Tree chains filled at their per-position NVLink share (rotated chains, NCCL search.cc).
    flips = flip_sizes("p5en-2x8")
    assert _winner_at(flips, 512 * 1024) == "TREE/LL128" and _winner_at(flips, 64 * 1024) == "TREE/LL"
    small = [name for s, name in flips if s < 8 * MiB]
    assert small == ["TREE/LL", "TREE/LL128"], small


def test_no_ll_region_p5():
    # AWS p5 (§4.5): no LL at all. Reproduced only through the FITTED per-crossing cost of host-staged LL on the
    # p5 preset (InterNet.ll_crossing_us = 12 us, fitted to this 16-rank region; held-out check below).
    flips = flip_sizes("p5-2x8")
    assert not any(name in LL_CELLS for _, name in flips)


def test_p5_ll_region_needs_the_fit():
    # Without the fitted term NCCL's AMD figures still leave Tree/LL best at small sizes (63 us vs 83 us at 1 KiB).
    from dynamiccl.harness.simulator.aws_regions import topology_for, with_fit
    from dynamiccl.harness.simulator.oracle import best_configs

    names = best_configs(with_fit(topology_for("p5", 2)), "AllReduce", np.array([1024, 64 * 1024])).names()
    assert names == ["TREE/LL", "TREE/LL"]


def test_published_16_rank_regions_match_flip_targets():
    from dynamiccl.harness.simulator.aws_regions import published_winner

    for topo, platform in (("p5en-2x8", "p5en"), ("p5-2x8", "p5")):
        for s in calibration.FLIP_GRID.tolist():
            assert published_winner(platform, "AllReduce", 16, s) == calibration._published_winner(topo, s), (topo, s)


def test_held_out_agreement_not_below_unfitted_model():
    # The per-platform fit sees only the 16-rank AllReduce regions; the 32/64-rank AllReduce and every
    # AllGather/ReduceScatter region are held out. As fitted, no held-out entry may be worse than the model with
    # its fitted fields neutral, and p5's LL term must carry over to 32 and 64 ranks (no LL there either).
    from dynamiccl.harness.simulator.aws_regions import heldout_scores, topology_for, with_fit

    fitted = heldout_scores()
    unfit = heldout_scores(lambda p, n: with_fit(topology_for(p, n)))
    for key, (a, _) in fitted.items():
        assert a >= unfit[key][0], (key, a, unfit[key][0])
    for nodes in (4, 8):
        assert fitted[("p5", "AllReduce", nodes)][0] >= unfit[("p5", "AllReduce", nodes)][0] + 0.25


@pytest.mark.xfail(strict=True, reason=(
    "known deviation: the Ring/LL128 band (12.5-28.5 MiB at 16 ranks, p5en) is not reproduced: a 2-node tree "
    "sends half the bytes through the NICs (nccl#946), so Tree/LL128 is NVLink-bound (~173 GB/s algbw) while "
    "Ring/LL128 is NIC-bound (~144 GB/s) with ~47 us more latency. No knob common to p5 and p5en can add it: p5's "
    "published 16-rank regions (Tree/LL128 up to the 30 MiB NVLSTree onset) forbid the same band, and every "
    "Tree/LL128 efficiency / NVLSTree latency that creates it on p5en creates it on p5 too "
    "(test_no_common_knob_gives_both_16_rank_sequences). A p5en-only fit was tried and not adopted: the best "
    "per-platform pair on the 16-rank regions (LL crossing 4 us, Tree/LL128 eff 0.8) raises 16-rank agreement "
    "87 -> 95 % but still has no band, and lowers the held-out p5en regions (32/64 ranks, AllGather/ReduceScatter) "
    "89.7 -> 88.6 % (python -m dynamiccl.harness.simulator.aws_regions --search). The 16-rank vertices are polygon corners of a tuner "
    "that skips <= 2-node jobs (aws-ofi-nccl, reference §8.4)"))
def test_ring_ll128_band_p5en():
    assert _winner_at(flip_sizes("p5en-2x8"), 20 * MiB) == "RING/LL128"


def test_no_common_knob_gives_both_16_rank_sequences():
    # The published p5en band and the published p5 sequence are incompatible for knobs that act on both (p5 and
    # p5en differ in the model only in EFA latency and host CPU): whenever a Tree/LL128 efficiency and an extra
    # NVLSTree latency make Ring/LL128 win inside 12.5-28.5 MiB on p5en, Ring/LL128 also wins somewhere on p5.
    from dynamiccl.harness.simulator.flip_fit import fitted

    sizes = np.array(sorted({int(2 ** (k / 4)) for k in range(4 * 23, 4 * 26 + 1)}))     # 8 - 64 MiB
    in_band = (sizes >= 12.5 * MiB) & (sizes < 28.5 * MiB)
    band_seen = 0
    for eff in (1.0, 0.8, 0.7, 0.6, 0.5):
        for lat in (0.0, 40.0, 80.0):
            with fitted(eff, lat):
                en = flip_sizes("p5en-2x8", sizes)
                p5 = flip_sizes("p5-2x8", sizes)
            en_band = any(_winner_at(en, int(s)) == "RING/LL128" for s in sizes[in_band])
            band_seen += en_band
            if en_band:
                assert any(name == "RING/LL128" for _, name in p5), (eff, lat, p5)
    assert band_seen >= 3          # the knobs do reach the band on p5en: the claim is not vacuous
