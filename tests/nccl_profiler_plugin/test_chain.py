"""DYNAMICCL_PROFILER_CHAIN: a second profiler plugin behind ours gets every call NCCL makes, with its own
handles. The chained plugin is test/build/libchain-probe.so, which counts what it is given and checks every
handle and parent; run alone as the emulator's only profiler and chained behind ours it must count the
same, while our own records stay whole."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

COLLS = 2000
EMU_F_CROSS_NODE = 0x8
PROXY_MASK = 2 | 4 | 64 | 8 | 16  # Coll | P2p | KernelCh | ProxyOp | ProxyStep (the probe's, not ours)


def emulate(built, plugin, abi=6, flags=0, env=None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("DYNAMICCL_", "CHAIN_PROBE_"))}
    full.update({"DYNAMICCL_COLLECTOR": "unix:/nonexistent/dccl.sock", **(env or {})})
    return subprocess.run([str(built["emulate"]), str(plugin), "--abi", str(abi), "--colls", str(COLLS),
                           "--warmup", "0", "--threads", "2", "--comms", "2", "--flags", str(flags)],
                          capture_output=True, text=True, timeout=120, env=full, check=True)


def probe_counts(out: str) -> dict[str, int]:
    line = next(ln for ln in out.splitlines() if ln.startswith("chain_probe:"))
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def our_stats(out: str) -> dict[str, int]:
    st = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", out.split("stats:", 1)[1])}
    # every record accounted for, chained or not: emitted = sent + undelivered (no collector here)
    assert st["records_emitted"] == st["records_sent"] + st["records_undelivered"] + st["records_dropped_ring_full"], st
    return st


@pytest.mark.parametrize("abi", [4, 6, 7])
def test_chained_profiler_sees_what_it_sees_alone(built, abi):
    alone = probe_counts(emulate(built, built["chain_probe"], abi).stdout)
    r = emulate(built, built["plugin"], abi, env={"DYNAMICCL_PROFILER_CHAIN": str(built["chain_probe"])})
    chained = probe_counts(r.stdout)
    assert chained == alone, (chained, alone)
    assert chained["kch"] == chained["kch_parent_ok"] == COLLS * 8
    assert chained["bad_handles"] == chained["foreign_parents"] == chained["double_stops"] == 0
    assert our_stats(r.stdout)["records_emitted"] == COLLS


@pytest.mark.parametrize("abi, flags, probe_mask, our_mask", [(6, 0, 2, None),  # Coll only: no KernelCh
                                                            (7, 0x400, 70, 70 | 32768)])  # ours adds KernelPhase
def test_events_only_our_mask_asked_for_are_not_forwarded(built, abi, flags, probe_mask, our_mask):
    """NCCL emits the union of both masks; the chained plugin gets only the types NCCL would give it alone
    (its mask and their parents), not the KernelCh or KernelPhase events only ours asked for, and ours
    still records them (every record whole)."""
    env = {"CHAIN_PROBE_MASK": str(probe_mask)} | ({"DYNAMICCL_EVENT_MASK": str(our_mask)} if our_mask else {})
    alone = probe_counts(emulate(built, built["chain_probe"], abi, flags=flags, env=env).stdout)
    r = emulate(built, built["plugin"], abi, flags=flags, env={**env, "DYNAMICCL_PROFILER_CHAIN": str(built["chain_probe"])})
    chained = probe_counts(r.stdout)
    assert chained == alone, (chained, alone)
    assert chained["bad_handles"] == chained["foreign_parents"] == chained["double_stops"] == 0
    assert our_stats(r.stdout)["records_emitted"] == COLLS


def test_events_only_the_chained_plugin_asked_for_and_our_sampling(built):
    """The probe asks for ProxyOp/ProxyStep (cross-node operations), which we do not record, and we sample
    1 in 4: the probe still gets every event with its own parents, and our records are sampled as alone."""
    env = {"CHAIN_PROBE_MASK": str(PROXY_MASK)}
    alone = probe_counts(emulate(built, built["chain_probe"], flags=EMU_F_CROSS_NODE, env=env).stdout)
    r = emulate(built, built["plugin"], flags=EMU_F_CROSS_NODE,
                env={**env, "DYNAMICCL_PROFILER_CHAIN": str(built["chain_probe"]), "DYNAMICCL_SAMPLE": "4"})
    chained = probe_counts(r.stdout)
    assert chained == alone and chained["starts"] > COLLS * 11, (chained, alone)  # 11 per collective without proxy events
    assert chained["bad_handles"] == chained["foreign_parents"] == 0
    st = our_stats(r.stdout)
    assert st["records_emitted"] == COLLS // 4 and st["sampled_out"] == COLLS - COLLS // 4, st


@pytest.mark.parametrize("abi, flags, mask", [(7, 0x400, 70 | 32768),  # v7 KernelPhase: our phase handles
                                              (6, 0x2000, 70 | 8 | 16)])  # per-peer timing: our proxy handles
def test_events_both_plugins_record_under_their_own_handles(built, abi, flags, mask):
    """Events both plugins keep a handle for that is not a Coll/KernelCh of ours (KernelPhase, ProxyOp/ProxyStep)
    go through the chain ring: the probe still counts what it counts alone, and our records are whole."""
    env = {"CHAIN_PROBE_MASK": str(mask), "DYNAMICCL_EVENT_MASK": str(mask)}
    alone = probe_counts(emulate(built, built["chain_probe"], abi, flags=flags, env=env).stdout)
    r = emulate(built, built["plugin"], abi, flags=flags, env={**env, "DYNAMICCL_PROFILER_CHAIN": str(built["chain_probe"])})
    chained = probe_counts(r.stdout)
    assert chained == alone and chained["starts"] > COLLS * 11, (chained, alone)
    assert chained["bad_handles"] == chained["foreign_parents"] == chained["double_stops"] == 0
    assert our_stats(r.stdout)["records_emitted"] >= COLLS


@pytest.mark.parametrize("target", ["missing", "self"])
def test_a_chain_that_cannot_load_is_logged_and_ours_still_records(built, tmp_path, target):
    path = str(tmp_path / "nope.so") if target == "missing" else str(built["plugin"])
    r = emulate(built, built["plugin"], env={"DYNAMICCL_PROFILER_CHAIN": path})
    assert "DYNAMICCL_PROFILER_CHAIN" in r.stderr and "not chained" in r.stderr, r.stderr
    assert r.stderr.count("not chained") == 1, "logged once per process"
    assert our_stats(r.stdout)["records_emitted"] == COLLS
