"""dynamiccl.harness.simulator.tuner_abi: the real .so through NCCL's tuner ABI — clear errors for a wrong library, symbol or
version; the engine and the simulated job take their decisions from the plugin."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, write_configs
from dynamiccl.harness.simulator.tuner_abi import PluginTuner, TunerABIError, TunerPlugin


def test_unsupported_abi_version(built):
    with pytest.raises(TunerABIError, match=r"tuner ABI v3 is not supported \(supported: v4, v5, v6\)"):
        TunerPlugin(built["plugin"], abi=3)


def test_missing_symbol_names_what_the_library_exports(built):
    with pytest.raises(TunerABIError, match=r"does not export ncclTunerPlugin_v5 \(exports: v6\)"):
        TunerPlugin(built["noop"], abi=5)


def test_not_a_tuner_library(built, tmp_path):
    src = tmp_path / "x.c"
    src.write_text("int something_else = 1;\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(tmp_path / "libx.so")], check=True)
    with pytest.raises(TunerABIError, match=r"does not export ncclTunerPlugin_v6 \(exports: no tuner symbol\)"):
        TunerPlugin(tmp_path / "libx.so")


def test_null_functions_in_the_table(built, tmp_path):
    src = tmp_path / "bad.c"
    src.write_text("struct t { const char* name; void* init; void* gci; void* fin; void* chunk; };\n"
                   "const struct t ncclTunerPlugin_v6 = { \"bad\", 0, 0, 0, 0 };\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(tmp_path / "libbad.so")], check=True)
    with pytest.raises(TunerABIError, match="has NULL init, getCollInfo, finalize"):
        TunerPlugin(tmp_path / "libbad.so")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tuner plugin not found"):
        TunerPlugin(tmp_path / "nope.so")


def test_noop_tuner_leaves_everything(built):
    p = TunerPlugin(built["noop"])
    assert p.name == "noop" and not p.has_control and not p.has_chunk_size
    ctx = p.init(1, 8, 1)
    t = np.arange(21, dtype=np.float32).reshape(7, 3)
    out, nch = p.get_coll_info(ctx, "AllReduce", 1024, t)
    assert (out == t).all() and nch == 0
    assert p.get_chunk_size(ctx, "AllReduce", 1024, 1, 2, 8, 4096) == 4096
    with pytest.raises(TunerABIError, match="no DynamICCL control functions"):
        p.reload()
    p.close()


@pytest.mark.parametrize("abi", [4, 5, 6])
def test_every_exported_abi_version_decides(private_plugin, abi):
    p = private_plugin("immediate", abi=abi)
    write_configs(p.conf, [TunerConfig(3, (Rule("ReduceScatter", 0, 1 << 20, "RING", "SIMPLE", 2, 65536),))])
    assert p.reload() == 1
    ctx = p.init(0x77, 16, 2)
    t = np.full((7, 3), 9.0, dtype=np.float32)
    out, nch = p.get_coll_info(ctx, "ReduceScatter", 4096, t)
    assert out[1, 2] == 0.0 and nch == 2
    assert p.get_chunk_size(ctx, "ReduceScatter", 4096, 1, 2, 2, 1 << 20) == (65536 if abi == 6 else 1 << 20)
    assert p.config_version(0x77) == 3
    p.finalize(ctx)


def test_engine_takes_decisions_from_the_plugin(private_plugin):
    from dynamiccl.harness.simulator.engine import Engine
    from dynamiccl.harness.simulator.workload import preset

    wl = preset("small")
    base = Engine(wl, seed=3).step()
    p = private_plugin("immediate")
    # tp AllReduce (1 MiB) -> TREE/LL128 with a 2-channel budget and a 64 KiB chunk; nothing else
    write_configs(p.conf, [TunerConfig(1, (Rule("AllReduce", 1 << 20, 1 << 20, "TREE", "LL128", 2, 65536),))])
    assert p.reload() == 1
    tuner = PluginTuner(p)
    eng = Engine(wl, seed=3, tuner=tuner)
    b = eng.step()
    from dynamiccl.collector.wire_format import FUNCS as WIRE_FUNCS

    tp = np.array([wl.comms[c].name.startswith("tp") for c in b.comm])
    ar = b.ops["func"] == WIRE_FUNCS.index("AllReduce")
    sel = tp & ar & (b.ops["count"] == (1 << 20) // 2)       # 1 MiB of bf16
    assert sel.any() and (ar & ~sel).sum() > 0
    assert set(b.ops["algo"][sel]) == {0} and set(b.ops["proto"][sel]) == {1} and set(b.ops["n_channels"][sel]) == {2}
    # every other collective kept NCCL's choice
    rest = ~sel & ar
    assert not (base.ops["algo"][sel] == 0).all() or not (base.ops["proto"][sel] == 1).all()  # a real change
    np.testing.assert_array_equal(b.ops["algo"][rest], base.ops["algo"][rest])
    np.testing.assert_array_equal(b.ops["proto"][rest], base.ops["proto"][rest])
    assert p.stats()["chunk_set"] > 0
    tuner.close()


def test_simulated_job_records_carry_the_tuner_decisions_and_version(private_plugin, tmp_path):
    """Through the driver: workers load the same plugin before the profiler; the records show the config's
    algorithm and the version that was applied when each step was decided."""
    import importlib.util
    from pathlib import Path

    from dynamiccl.collector.wire_format import FUNCS as WIRE_FUNCS
    from dynamiccl.harness.simulator.driver import SimulatedJob

    conf_spec = importlib.util.spec_from_file_location(
        "profiler_conftest", Path(__file__).resolve().parents[1] / "nccl_profiler_plugin" / "conftest.py")
    mod = importlib.util.module_from_spec(conf_spec)
    conf_spec.loader.exec_module(mod)
    addr = f"unix:{tmp_path}/c.sock"
    col = mod.FakeCollector(addr)
    p = private_plugin("immediate")
    write_configs(p.conf, [TunerConfig(5, (Rule("AllReduce", 0, 1 << 30, "RING", "LL", 4),))])
    assert p.reload() == 1

    def hook(t: PluginTuner, step: int) -> None:
        if step == 3:         # the retuner pushes version 6 between steps 2 and 3
            write_configs(p.conf, [TunerConfig(5, (Rule("AllReduce", 0, 1 << 30, "RING", "LL", 4),)),
                                   TunerConfig(6, (Rule("AllReduce", 0, 1 << 30, "TREE", "SIMPLE", 2),))])
            t.plugin.reload()

    tuner = PluginTuner(p, step_hook=hook)
    job = SimulatedJob("small", "stationary", collector=addr, duration_s=0.02, tuner=tuner).start()
    res = job.wait()
    assert res.records > 0 and all(s.get("tuner_version_misses") == 0 for s in res.plugin_stats), res.plugin_stats
    assert col.wait_for(lambda: len(col.events()) >= res.records, timeout=20)
    ev = col.events()
    col.kill()
    ar = ev[ev["func"] == WIRE_FUNCS.index("AllReduce")]
    v5, v6 = ar[ar["tuner_config_version"] == 5], ar[ar["tuner_config_version"] == 6]
    assert len(v5) and len(v6) and len(v5) + len(v6) == len(ar)
    assert set(v5["algo"]) == {1} and set(v5["proto"]) == {0} and set(v5["n_channels"]) == {4}
    assert set(v6["algo"]) == {0} and set(v6["proto"]) == {2} and set(v6["n_channels"]) == {2}
    tuner.close()
