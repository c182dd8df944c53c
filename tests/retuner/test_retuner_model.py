"""NCCL's model refitted for the retuner: the in-flight-window lower bound NCCL's model lacks, and the planner
ruling a cell out by it."""
from __future__ import annotations

import numpy as np

from dynamiccl.retuner.config import PolicyConfig, RetunerConfig
from dynamiccl.retuner.model import CommModel, Fit
from dynamiccl.retuner.planner import Planner
from dynamiccl.retuner.types import Target
from dynamiccl.harness.simulator.cost_model import PROTOS, RING
from dynamiccl.harness.simulator.perf_model import NetworkState, expected_time
from dynamiccl.harness.simulator.topology import preset

NB = 24 << 20          # a 24 MiB AllReduce between two nodes (a data-parallel gradient bucket)


def test_window_floor_is_a_lower_bound_that_nccl_model_misses():
    topo = preset("h100-2x8")
    m = CommModel(topo, nnodes=2, nranks=2)
    fit = m.refit("latency", "AllReduce", NB, ("RING", "LL128"), ratio=2.5)
    assert fit.dlat_us > 50
    floor_ll = m.window_floor_us("AllReduce", NB, ("RING", "LL"), 0, fit)
    # NCCL's refitted model prices RING/LL well below what the window alone allows ...
    assert floor_ll > 2 * m.predict("AllReduce", NB, ("RING", "LL"), fit)
    # ... and the bound stays below the simulator's "reality" for every Ring protocol under +150 µs
    sub = m.topology
    st = NetworkState(added_latency_us=150.0)
    for proto in ("LL", "LL128", "SIMPLE"):
        nc = m.default_channels("AllReduce", NB, ("RING", proto))
        ck = int(m.model().chunk_size("AllReduce", RING, PROTOS.index(proto), np.array([NB]), np.array([nc]))[0])
        real_us = float(expected_time(sub, "AllReduce", np.array([NB]), "RING", proto, nc, ck, st)[0])
        f = m.window_floor_us("AllReduce", NB, ("RING", proto), 0, Fit(dlat_us=150.0))
        assert 0 < f < real_us, proto
    # no added latency, a single node, or not a Ring: no bound
    assert m.window_floor_us("AllReduce", NB, ("RING", "LL"), 0, Fit()) == 0.0
    assert m.window_floor_us("AllReduce", NB, ("TREE", "LL"), 0, fit) == 0.0
    assert CommModel(topo, nnodes=1, nranks=8).window_floor_us("AllReduce", NB, ("RING", "LL"), 0, fit) == 0.0


def test_planner_skips_a_cell_whose_window_alone_is_much_slower_than_the_incumbent():
    pl = Planner(RetunerConfig(topology="h100-2x8", policy=PolicyConfig(max_cells=6)))
    t = Target(0x1f, "AllReduce", 24, nranks=2, nnodes=2, comm_name="dp0")
    kw = dict(kind="latency", incumbent=None, inc_cell=("RING", "SIMPLE"), ratio=2.5, bias={}, unapplicable=set())
    without = pl.cells(t, **kw)
    assert "RING/LL/0" in [c.name for c in without.candidates]          # NCCL's model alone would probe it
    inc_us = pl.model(t).predict("AllReduce", t.nbytes(), ("RING", "SIMPLE"), without.fit)
    plan = pl.cells(t, **kw, inc_measured_us=inc_us)
    assert "RING/LL/0" not in [c.name for c in plan.candidates]
    assert "in-flight window" in plan.skipped["RING/LL/0"]
    assert "RING/LL128/0" in [c.name for c in plan.candidates]
