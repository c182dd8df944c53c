"""The kit's extra launches: one short programme (the worker's ``probe`` phase) run under settings
the main launch does not use, so that their records and counts compare launch by launch.

* ``probe_ref``: the plugins with their defaults, the record clock forced to ``clock_gettime``
  (``DYNAMICCL_CLOCK=0``): the reference for the others, and check 7's reference clock (the default is
  the TSC where the host qualifies, so the defaults alone would compare the TSC with itself);
* ``probe_tsc``: ``DYNAMICCL_CLOCK=1`` (the TSC record clock asked for: a warning where it does not qualify);
* ``probe_peer``: ``DYNAMICCL_EVENT_MASK=94`` (Coll|P2p|KernelCh|ProxyOp|ProxyStep: PEER records);
* ``probe_chainonly``: NCCL's profiler is the chain probe alone (``test/chain_probe.c``), which prints
  its event counts at its last finalize;
* ``probe_chained``: DynamICCL with ``DYNAMICCL_PROFILER_CHAIN`` set to the chain probe.

Checked by :mod:`dynamiccl.validate.checks_extra`. Standard library only (plus ``make``/``cc`` to
build the chain probe when it is missing).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .launch import Launch

__all__ = ["PROBE", "PEER_MASK", "build_chain_probe", "extra_launches", "uses_other_profiler"]

PROBE = {"sizes": [[1 << 20, 60], [64 << 10, 60]]}   # (bytes, calls) of AllReduce per launch
PEER_MASK = 94                                       # Coll|P2p|KernelCh|ProxyOp|ProxyStep
CHAIN_PROBE = "test/build/libchain-probe.so"


def build_chain_probe() -> tuple[str | None, str]:
    """(path of the chain probe library or None, why not)."""
    from dynamiccl import nccl_profiler_plugin
    folder = Path(nccl_profiler_plugin.__file__).parent
    lib = folder / CHAIN_PROBE
    if lib.is_file():
        return str(lib), ""
    if shutil.which("make") is None or not (folder / "test" / "chain_probe.c").is_file():
        return None, f"the chain probe is not built and cannot be (make -C {folder} {CHAIN_PROBE})"
    res = subprocess.run(["make", "-C", str(folder), CHAIN_PROBE], capture_output=True, text=True)
    if res.returncode != 0 or not lib.is_file():
        return None, f"building the chain probe failed: {res.stderr[-800:]}"
    return str(lib), ""


def _logged(name: str, **env: str) -> dict:
    """NCCL's INFO lines of the plugins (subsystem PROFILE: 'chained to', clock warnings) per rank."""
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,PROFILE",
            "NCCL_DEBUG_FILE": "{out}/nccl." + name + ".%p.log", **env}


def extra_launches() -> tuple[list[Launch], list[str]]:
    """The extra launches, in the order they run, and notes on any left out."""
    out = [Launch("probe_ref", ["probe"], True, env=_logged("probe_ref", DYNAMICCL_CLOCK="0")),
           Launch("probe_tsc", ["probe"], True, env=_logged("probe_tsc", DYNAMICCL_CLOCK="1")),
           Launch("probe_peer", ["probe"], True, env=_logged("probe_peer", DYNAMICCL_EVENT_MASK=str(PEER_MASK)))]
    probe, why = build_chain_probe()
    if probe is None:
        return out, [why]
    out += [Launch("probe_chainonly", ["probe"], True, env=_logged("probe_chainonly", NCCL_PROFILER_PLUGIN=probe)),
            Launch("probe_chained", ["probe"], True, env=_logged("probe_chained", DYNAMICCL_PROFILER_CHAIN=probe))]
    return out, []


def uses_other_profiler(launch: dict) -> bool:
    """A launch whose NCCL profiler is not DynamICCL's (it sends no records and no STATS)."""
    return bool(launch.get("env", {}).get("NCCL_PROFILER_PLUGIN"))
