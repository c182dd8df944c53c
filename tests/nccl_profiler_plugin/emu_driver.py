"""Subprocess driver: replay a scripted scenario through the emulator against a plugin.

Usage: python emu_driver.py SPEC.json  -> prints one JSON line {"ok", "error", "stats", "mask", "calls"}

Runs in its own process so a plugin crash or a SIGPIPE fails the test instead of killing pytest,
and so every scenario starts with fresh plugin globals and environment.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from dynamiccl.collector import wire_format as wf  # noqa: E402
from dynamiccl.nccl_profiler_plugin.emulator import Emulator, EmulatorError  # noqa: E402


def _ops(spec: list[dict]) -> np.ndarray:
    """An op's gpu_start_rel / gpu_end_rel (ns, may be negative) are pTimers relative to the wall clock
    now: a GPU clock aligned with the host's, as real NCCL's."""
    ops = Emulator.ops(len(spec))
    now = time.time_ns()
    for i, op in enumerate(spec):
        for k, v in op.items():
            if k.endswith("_rel"):
                ops[i][k[:-4] + "_ns"] = now + v
            else:
                ops[i][k] = v
    return ops


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out: dict = {"ok": True, "error": None, "comms": []}
    try:
        emu = Emulator(spec["plugin"], spec.get("abi", 6))
    except EmulatorError as e:
        print(json.dumps({"ok": False, "error": str(e), "stage": "open"}))
        return 0
    comms: list[int] = []
    try:
        for step in spec["steps"]:
            op = step["op"]
            if op == "init":
                comms.append(emu.comm_init(step["hash"], step.get("name"), step.get("nnodes", 1),
                                           step.get("nranks", 2), step.get("rank", 0), step.get("threads", 1)))
                out["mask"] = emu.mask
            elif op == "run":
                emu.run(comms[step.get("comm", 0)], _ops(step["ops"]))
            elif op == "sync":
                emu.sync(comms[step.get("comm", 0)])
            elif op == "sleep":
                time.sleep(step["s"])
            elif op == "wait_path":
                deadline = time.monotonic() + step.get("timeout", 20)
                while not os.path.exists(step["path"]):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"timed out waiting for {step['path']}")
                    time.sleep(0.01)
            elif op == "touch":
                Path(step["path"]).touch()
            elif op == "finalize":
                t0 = time.monotonic()
                emu.comm_finalize(comms[step.get("comm", 0)])
                out["finalize_s"] = time.monotonic() - t0
            else:
                raise ValueError(f"unknown step {op}")
    except EmulatorError as e:
        out.update(ok=False, error=str(e))
    st = emu.stats(wf.STATS_DTYPE)
    out["stats"] = None if st is None else {k: int(st[k]) for k in wf.STATS_DTYPE.names
                                            if k not in ("pad", "reserved")}
    out["calls"] = emu.plugin_calls
    emu.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
