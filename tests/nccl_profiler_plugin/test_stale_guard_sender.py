"""The stale-timestamp guard end to end: the real .so, its sender thread and a collector, with pTimers
on the host's wall clock (emu_driver's *_rel fields), as real NCCL's %globaltimer. Sends, so the
KernelCh order guard (collectives only) and the span check (off in the emulator) pass every record:
only the stale-timestamp guard can untime the stale ones."""
from __future__ import annotations

import numpy as np

from dynamiccl.collector import wire_format as wf
from test_emulator_stream import F, make_ops

WINDOW = 64  # DCCL_GUARD_WINDOW


def _send(seq: int, start_rel: int, span: int) -> dict:
    op = dict(make_ops(1)[0], func=F["Send"], root=1, n_channels=1, seq_number=seq)
    del op["gpu_start_ns"], op["gpu_end_ns"]
    return dict(op, gpu_start_rel=start_rel, gpu_end_rel=start_rel + span)


def test_sender_untimes_stale_ptimers(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    steps = [{"op": "init", "hash": 0x57A1, "nnodes": 1, "nranks": 4, "rank": 0, "threads": 1}]
    # one op per step: its pTimers are read against the clock right before it runs
    steps += [{"op": "run", "ops": [_send(i, 0, 2000)]} for i in range(WINDOW + 4)]
    stale = [_send(WINDOW + 4 + i, -5_000_000_000 + 1000 * i, 2000) for i in range(3)]  # 5 s old, 2 us long
    steps += [{"op": "run", "ops": [op]} for op in stale]
    steps += [{"op": "run", "ops": [_send(WINDOW + 7, 0, 2000)]}, {"op": "sync"}, {"op": "finalize"}]
    # a loaded machine can stall a step by milliseconds: a tolerance of 50 ms still refuses 5 s
    res = run_scenario(steps, sock_addr, env={"DYNAMICCL_STALE_GUARD_US": "50000"})
    assert res["ok"], res
    ev = col.events()
    ev = ev[np.argsort(ev["seq_number"])]
    assert len(ev) == WINDOW + 8
    suspect = (ev["flags"] & wf.EventFlags.TIMING_SUSPECT) != 0
    assert suspect.tolist() == [False] * (WINDOW + 4) + [True] * 3 + [False], suspect.tolist()
    assert np.all(ev["timing_source"][suspect] == wf.TimingSource.NONE)
    assert np.all(ev["timing_source"][~suspect] == wf.TimingSource.KERNEL_GPU)
    assert res["stats"]["kernel_ch_timing_suspect"] == 3, res["stats"]
    assert res["stats"]["records_sent"] == WINDOW + 8
