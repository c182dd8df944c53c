"""Closing the loop: the profiler plugin's records carry the tuner's applied config version.

A subprocess loads the real tuner (as NCCL would, by the path in NCCL_TUNER_PLUGIN), applies versions,
and replays collectives through the real profiler with the NCCL call-sequence emulator; a fake collector
decodes the records."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, write_configs

REPO = Path(__file__).resolve().parents[2]
PROFILER_DIR = REPO / "dynamiccl" / "nccl_profiler_plugin"

SCRIPT = r"""
import json, sys, time
sys.path.insert(0, {repo!r})
from dynamiccl.nccl_profiler_plugin.emulator import Emulator
from dynamiccl.harness.simulator.tuner_abi import TunerPlugin
spec = json.loads(sys.argv[1])

def ops(n, seq0):
    o = Emulator.ops(n)
    o["func"] = 1; o["datatype"] = 7; o["algo"] = 1; o["proto"] = 2; o["n_channels"] = 2; o["n_warps"] = 16
    o["count"] = 1024; o["seq_number"] = range(seq0, seq0 + n)
    o["gpu_start_ns"] = [10**18 + 10**6 * i for i in range(n)]; o["gpu_end_ns"] = o["gpu_start_ns"] + 5000
    return o

tuner = None
if spec["tuner_first"]:
    tuner = TunerPlugin(spec["tuner"]); tuner.configure(spec["conf"], mode="agree", poll_ms=0); tuner.reload()
    tuner.apply_version(7)
emu = Emulator(spec["profiler"], 6)
cid = emu.comm_init(0xabc, "dp", 1, 2, 0, 1)
if tuner is None:           # NCCL's order for the first communicator: profiler init, then the tuner
    tuner = TunerPlugin(spec["tuner"]); tuner.configure(spec["conf"], mode="agree", poll_ms=0); tuner.reload()
    tuner.apply_version(7)
    time.sleep(spec["wait_s"])   # the profiler's sender thread finds the tuner (retried every second)
emu.run(cid, ops(5, 0)); emu.sync(cid)
tuner.apply_version(8)
emu.run(cid, ops(5, 5)); emu.sync(cid)
time.sleep(0.3)
emu.comm_finalize(cid); emu.close()
print(json.dumps({{"applied": tuner.applied_version}}))
"""


def _fake_collector_cls():
    spec = importlib.util.spec_from_file_location("profiler_conftest", REPO / "tests" / "nccl_profiler_plugin" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.FakeCollector


@pytest.fixture(scope="module")
def profiler_built():
    subprocess.run(["make", "-s", "-C", str(PROFILER_DIR), "libnccl-profiler-dynamiccl.so", "emulator"], check=True,
                   capture_output=True)
    return PROFILER_DIR / "libnccl-profiler-dynamiccl.so"


def _run(built, profiler_built, tmp_path, *, tuner_first: bool, tuner_env: str | None, wait_s: float = 0.0):
    conf = tmp_path / "tuner.conf"
    write_configs(conf, [TunerConfig(7, (Rule("AllReduce", 0, 1 << 20, "RING", "LL"),)),
                         TunerConfig(8, (Rule("AllReduce", 0, 1 << 20, "TREE", "LL"),))])
    addr = f"unix:{tmp_path}/c.sock"
    col = _fake_collector_cls()(addr)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYNAMICCL_", "NCCL_"))}
    env.update(DYNAMICCL_COLLECTOR=addr, DYNAMICCL_FLUSH_MS="20")
    if tuner_env is not None:
        env["NCCL_TUNER_PLUGIN"] = tuner_env
    spec = {"tuner": str(built["plugin"]), "profiler": str(profiler_built), "conf": str(conf),
            "tuner_first": tuner_first, "wait_s": wait_s}
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(repo=str(REPO)), json.dumps(spec)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["applied"] == 8
    assert col.wait_for(lambda: len(col.events()) == 10)
    ev = col.events()
    col.kill()
    ev = ev[ev["seq_number"].argsort()]
    return [int(v) for v in ev["tuner_config_version"]]


def test_records_carry_the_applied_version(built, profiler_built, tmp_path):
    versions = _run(built, profiler_built, tmp_path, tuner_first=True, tuner_env=str(built["plugin"]))
    assert versions == [7] * 5 + [8] * 5


def test_tuner_loaded_after_the_profiler_is_found_by_the_sender_thread(built, profiler_built, tmp_path):
    versions = _run(built, profiler_built, tmp_path, tuner_first=False, tuner_env=str(built["plugin"]), wait_s=1.5)
    assert versions == [7] * 5 + [8] * 5


def test_no_tuner_plugin_means_version_zero(built, profiler_built, tmp_path):
    versions = _run(built, profiler_built, tmp_path, tuner_first=True, tuner_env="none")
    assert versions == [0] * 10
