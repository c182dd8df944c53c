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


@pytest.mark.xfail(strict=True, reason="known deviation: LL stays best on EFA up to a few MiB in the model "
                   "(published Tree/LL -> Tree/LL128 at 192 KiB on p5en; no LL at all on p5)")
def test_small_message_protocol_flip_p5en():
    flips = flip_sizes("p5en-2x8")
    assert _winner_at(flips, 512 * 1024) == "TREE/LL128" and _winner_at(flips, 64 * 1024) == "TREE/LL"


@pytest.mark.xfail(strict=True, reason="known deviation: the narrow Ring/LL128 band (12.5–28.5 MiB, p5en) "
                   "is not reproduced")
def test_ring_ll128_band_p5en():
    assert _winner_at(flip_sizes("p5en-2x8"), 20 * MiB) == "RING/LL128"
