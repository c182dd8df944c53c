"""Reload while the job runs: the plugin's own thread picks up every new file while another thread keeps
calling getCollInfo; a malformed file in between changes nothing (last good config kept, error counted)."""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, write_configs

CELLS = {"TREE": 0, "RING": 3}   # (algo, LL) flat index


def _cfg(v: int) -> TunerConfig:
    algo = ("TREE", "RING")[v % 2]
    return TunerConfig(v, (Rule("AllReduce", 0, 1 << 30, algo, "LL", v % 64 + 1),))


def test_reload_while_running(private_plugin):
    p = private_plugin("immediate", poll_ms=10)
    ctx = p.init(0x5, 8, 1)                         # first init starts the reload thread
    seen: dict[tuple[int, int], int] = {}
    stop = threading.Event()
    errors: list[str] = []

    def nccl_thread() -> None:
        table = np.full((7, 3), 20.0, dtype=np.float32)
        while not stop.is_set():
            out, nch = p.get_coll_info(ctx, "AllReduce", 4096, table)
            cell = int(np.argmin(out))
            key = (cell, nch)
            seen[key] = seen.get(key, 0) + 1
            if not (nch == 0 and (out == table).all()) and not any(
                    cell == CELLS[_cfg(v).rules[0].algo] and nch == v % 64 + 1 for v in range(1, 41)):
                errors.append(f"decision {key} belongs to no version")

    th = threading.Thread(target=nccl_thread)
    th.start()
    try:
        applied = []
        for v in range(1, 41):
            if v == 20:     # a bad file between two good ones, written atomically
                tmp = p.conf.with_name(".bad")
                tmp.write_text("version 999\nAllReduce 0 max RING LL 0 0\n")
                os.replace(tmp, p.conf)
            else:
                write_configs(p.conf, [_cfg(max(1, v - 2)), _cfg(v - 1), _cfg(v)] if v > 2 else [_cfg(v)])
            deadline = time.monotonic() + 5
            while p.applied_version != v and v != 20 and time.monotonic() < deadline:
                time.sleep(0.005)
            applied.append(p.applied_version)
            if v == 20:
                time.sleep(0.1)
                assert p.applied_version == 19 and "expected 8 fields" in p.last_error()
    finally:
        stop.set()
        th.join()
    assert [a for i, a in enumerate(applied, 1) if i != 20] == [v for v in range(1, 41) if v != 20]
    assert not errors, errors[:3]
    assert len(seen) > 5                              # the reader saw many versions go by
    st = p.stats()
    assert st["reload_errors"] == 1 and st["reloads"] >= 39 and st["calls"] == sum(seen.values())
