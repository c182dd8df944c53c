import numpy as np
import pytest

from dynamiccl.harness.simulator.oracle import SIZE_BUCKETS, best_configs
from dynamiccl.harness.simulator.perf_model import NetworkState
from dynamiccl.harness.simulator.topology import preset

STATES = {
    "idle": NetworkState(),
    "bw_drop": NetworkState(link_bw_factor=(1.0, 0.5)),
    "latency": NetworkState(added_latency_us=50.0),
    "competing": NetworkState(competing_share=0.6),
}


@pytest.mark.parametrize("topo", ["h100-2x8", "a100-2x8", "h100-8x8"])
@pytest.mark.parametrize("state", list(STATES))
def test_oracle_never_worse_than_default(topo, state):
    t = preset(topo)
    st = STATES[state] if state != "bw_drop" else NetworkState(link_bw_factor=tuple([0.5] + [1.0] * (t.nodes - 1)))
    r = best_configs(t, "AllReduce", SIZE_BUCKETS, st)
    assert np.all(r.time_us <= r.default_time_us * (1 + 1e-12))
    assert np.all(np.isfinite(r.time_us))


def test_retuning_pays_off_under_congestion():
    t = preset("h100-8x8")
    r = best_configs(t, "AllReduce", SIZE_BUCKETS, NetworkState(competing_share=0.6))
    assert r.speedup.max() > 1.2


def test_oracle_respects_enabled_cells_and_chunk_limit():
    from dynamiccl.harness.simulator.cost_model import NcclModel
    t = preset("h100-2x8")
    m = NcclModel(t, exclude_algos=("NVLS_TREE",))
    r = best_configs(t, "AllReduce", SIZE_BUCKETS, model=m)
    assert "NVLS_TREE/SIMPLE" not in r.names()
    for i, s in enumerate(SIZE_BUCKETS):
        d = m.chunk_size("AllReduce", int(r.algo[i]), int(r.proto[i]), np.array([s]), np.array([r.n_channels[i]]))
        assert r.chunk[i] <= d[0]
        assert 1 <= r.n_channels[i] <= m.comm_channels
