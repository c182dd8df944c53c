"""The profiler-plugin ABI calls the simulator makes, seen from the plugin's side.

A recording plugin (``abi_recorder.c``, compiled here) logs every call it receives; a :class:`SimulatedJob`
drives it through the emulator exactly as it drives the real plugin. The log must show NCCL's sequence for
each of the engine's records: init per (communicator, local rank) with the engine's shape, GroupApi ->
CollApi -> Coll (v5/v6; Group -> Coll in v4) with the engine's decision, one KernelCh per channel carrying
the engine's GPU timestamps, ProxyOp children only when the communicator crosses nodes, events gated by the
activation mask the plugin wrote, finalize per init. Wrong symbols/versions and a failing init must give a
clear :class:`DriverError`.
"""
from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from dynamiccl.collector import wire_format as wf
from dynamiccl.harness.simulator import scenario as S
from dynamiccl.harness.simulator import workload as W
from dynamiccl.harness.simulator.driver import DriverError, SimulatedJob
from dynamiccl.harness.simulator.engine import EMU_F_CROSS_NODE, Engine

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "dynamiccl" / "nccl_profiler_plugin"
SRC = Path(__file__).with_name("abi_recorder.c")
KERNEL_CH_STOP, GROUP_END_API_START = 22, 24
PROXY_OP, KERNEL_CH = 1 << 3, 1 << 6
COLL, GROUP_API, COLL_API, P2P, P2P_API = 1 << 1, 1 << 8, 1 << 9, 1 << 2, 1 << 10
WL = W.preset("small")


@pytest.fixture(scope="module")
def emu_lib():
    subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR), "emulator"], check=True, capture_output=True, text=True)
    return PLUGIN_DIR / "emulator" / "libdccl-nccl-emu.so"


def _compile(out: Path, *defines: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc/gcc) to build the ABI recorder plugin")
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", f"-I{PLUGIN_DIR / 'include'}", *defines,
                        str(SRC), "-o", str(out), "-lpthread"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def recorder(tmp_path_factory):
    return _compile(tmp_path_factory.mktemp("rec") / "librecorder.so")


@pytest.fixture(scope="module")
def recorder_v4_only(tmp_path_factory):
    return _compile(tmp_path_factory.mktemp("rec4") / "librecorder4.so", "-DONLY_V4")


# ------------------------------------------------------------------------------------------------
def run_job(recorder, emu_lib, tmp_path, *, abi=6, scenario=None, seed=3, duration=0.006, env=None):
    prefix = tmp_path / "calls"
    job = SimulatedJob(WL, scenario, collector=f"unix:{tmp_path}/unused.sock", seed=seed, duration_s=duration,
                       plugin=recorder, emu_lib=emu_lib, abi=abi,
                       plugin_env={"DCCL_ABI_RECORD": str(prefix), **(env or {})})
    res = job.start().wait(timeout=60)
    logs = [p.read_text().splitlines() for p in sorted(tmp_path.glob("calls.*"))]
    assert len(logs) == 2, "one log per node worker process"
    return res, logs


def expected_per_node(scenario=None, seed=3, duration=0.006):
    """Per node: {comm key: [op records in replay order]} and the node's CommInits, from the engine."""
    eng = Engine(WL, scenario, seed=seed, duration_s=duration)
    per_node = [defaultdict(list) for _ in range(eng.n_nodes)]
    for b in eng.steps():
        for n in range(eng.n_nodes):
            ops, keys = b.node(n)
            for op, k in zip(ops, keys.tolist()):
                per_node[n][k].append(op)
    return per_node, [eng.node_comms(n) for n in range(eng.n_nodes)]


def parse(lines):
    """-> inits (in order), events {id: dict}, children {parent id: [ids]}, order of top-level ops per ctx."""
    inits, events, children, tops, finals = [], {}, defaultdict(list), defaultdict(list), []
    for i, ln in enumerate(lines):
        f = ln.split("|")
        if f[0] == "init":
            inits.append({"version": f[1], "ctx": int(f[2]), "hash": int(f[3]), "name": f[4], "nnodes": int(f[5]),
                          "nranks": int(f[6]), "rank": int(f[7]), "mask": int(f[8])})
        elif f[0] == "start":
            ctx, eid, kind, parent, rank = int(f[1]), int(f[2]), f[3], int(f[4]), int(f[5])
            ev = {"ctx": ctx, "kind": kind, "parent": parent, "rank": rank, "fields": f[6:], "line": i,
                  "records": [], "stopped": False}
            events[eid] = ev
            children[parent].append(eid)
            if kind in ("Coll", "P2p"):
                tops[ctx].append(eid)
        elif f[0] == "record":
            events[int(f[1])]["records"].append((int(f[2]), int(f[3])))
        elif f[0] == "stop":
            events[int(f[1])]["stopped"] = True
        elif f[0] == "finalize":
            finals.append((int(f[1]), i))
    return inits, events, children, tops, finals


def node_of(inits, node_comms):
    got = {(d["hash"], d["rank"]) for d in inits}
    for n, comms in enumerate(node_comms):
        if got == {(c.comm_hash, c.rank) for c in comms}:
            return n
    raise AssertionError(f"inits {sorted(got)} match no simulated node")


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("abi", [6, 5, 4])
def test_call_sequence_matches_the_engine(abi, recorder, emu_lib, tmp_path):
    res, logs = run_job(recorder, emu_lib, tmp_path, abi=abi)
    per_node, node_comms = expected_per_node()
    assert res.records == sum(len(v) for node in per_node for v in node.values()) > 500
    seen_nodes = set()
    for lines in logs:
        inits, events, children, tops, finals = parse(lines)
        n = node_of(inits, node_comms)
        seen_nodes.add(n)
        # init once per (communicator, local rank), in the node's order, with the engine's shape
        assert [(d["hash"], d["name"], d["nnodes"], d["nranks"], d["rank"]) for d in inits] == \
            [(c.comm_hash, c.name, c.nnodes, c.nranks, c.rank) for c in node_comms[n]]
        assert {d["version"] for d in inits} == {f"v{abi}"}
        ctx_of_key = {c.key: d["ctx"] for c, d in zip(node_comms[n], inits)}
        # finalize once per context, after every event of the run
        assert sorted(c for c, _ in finals) == sorted(ctx_of_key.values())
        assert min(i for _, i in finals) > max(e["line"] for e in events.values())
        for key, ops in per_node[n].items():
            ctx = ctx_of_key[key]
            comm = node_comms[n][key]
            got = tops[ctx]
            assert len(got) == len(ops)
            for eid, op in zip(got, ops):
                ev = events[eid]
                assert ev["rank"] == comm.rank and ev["stopped"]
                func = wf.FUNCS[op["func"]]
                p2p = func in ("Send", "Recv")
                if p2p:
                    pfunc, count, peer, nch = ev["fields"]
                    assert (ev["kind"], pfunc, int(count), int(peer), int(nch)) == \
                        ("P2p", func, op["count"], op["root"], op["n_channels"])
                else:
                    seq, cfunc, count, root, dtype, nch, nwarps, algo, proto = ev["fields"]
                    assert ev["kind"] == "Coll"
                    assert (int(seq), cfunc, int(count), int(root), dtype) == \
                        (op["seq_number"], func, op["count"], op["root"], wf.DATATYPES[op["datatype"]])
                    assert (int(nch), int(nwarps), algo, proto) == \
                        (op["n_channels"], op["n_warps"], wf.ALGOS[op["algo"]], wf.PROTOS[op["proto"]])
                # parents: v5/v6 GroupApi -> CollApi|P2pApi -> Coll|P2p; v4 Group -> Coll|P2p
                parent = events[ev["parent"]]
                if abi >= 5:
                    assert parent["kind"] == ("P2pApi" if p2p else "CollApi") and parent["stopped"]
                    assert parent["fields"][:2] == [func, str(op["count"])]
                    group = events[parent["parent"]]
                    assert group["kind"] == "GroupApi" and group["stopped"]
                    assert (GROUP_END_API_START, 0) in group["records"]
                else:
                    assert parent["kind"] == "Group" and parent["stopped"]
                # the GPU side: one KernelCh per channel with the engine's timestamps
                kids = [events[k] for k in children[eid]]
                kch = sorted((k for k in kids if k["kind"] == "KernelCh"), key=lambda k: int(k["fields"][0]))
                assert [int(k["fields"][0]) for k in kch] == list(range(op["n_channels"]))
                for c, k in enumerate(kch):
                    assert int(k["fields"][1]) == int(op["gpu_start_ns"]) + c
                    assert k["records"] == [(KERNEL_CH_STOP, int(op["gpu_end_ns"]) - c)] and k["stopped"]
                # network proxy ops only when the communicator crosses nodes
                proxy = [k for k in kids if k["kind"] == "ProxyOp"]
                cross = bool(op["flags"] & EMU_F_CROSS_NODE)
                assert cross == (comm.nnodes > 1)
                assert len(proxy) == (op["n_channels"] if cross else 0)
                assert all(p["stopped"] for p in proxy)
    assert seen_nodes == {0, 1}


def test_activation_mask_gates_events(recorder, emu_lib, tmp_path):
    # a plugin that only asks for Coll (+ its API parents) gets no KernelCh and no ProxyOp, as in NCCL
    _, logs = run_job(recorder, emu_lib, tmp_path, env={"DCCL_ABI_MASK": str(COLL | COLL_API | GROUP_API)})
    for lines in logs:
        inits, events, _, tops, _ = parse(lines)
        kinds = {e["kind"] for e in events.values()}
        assert {d["mask"] for d in inits} == {COLL | COLL_API | GROUP_API}
        assert "KernelCh" not in kinds and "ProxyOp" not in kinds
        assert "Coll" in kinds and sum(len(v) for v in tops.values()) > 0


def test_regimes_reach_the_plugin_as_gpu_timestamps(recorder, emu_lib, tmp_path):
    # what the plugin measures (KernelCh stop - start pTimers) is the engine's duration, regime included:
    # a 60 % bandwidth drop stretches the cross-node all-reduce, not the NVLink-only one
    def durations(scenario, sub):
        d = tmp_path / sub
        d.mkdir()
        _, logs = run_job(recorder, emu_lib, d, scenario=scenario, duration=0.01)
        out = defaultdict(list)
        for lines in logs:
            inits, events, children, tops, _ = parse(lines)
            nnodes = {d_["ctx"]: d_["nnodes"] for d_ in inits}
            for ctx, ids in tops.items():
                for eid in ids:
                    ev = events[eid]
                    if ev["kind"] != "Coll" or ev["fields"][1] != "AllReduce":
                        continue
                    k0 = next(events[k] for k in children[eid] if events[k]["kind"] == "KernelCh"
                              and events[k]["fields"][0] == "0")
                    out[nnodes[ctx] > 1].append((k0["records"][0][1] - int(k0["fields"][1])) / 1e3)
        return {cross: float(np.median(v)) for cross, v in out.items()}

    drop = S.from_dict({"name": "drop", "events": [{"at_s": 0, "kind": "bw_drop", "magnitude": 0.6}]})
    base, slow = durations(None, "base"), durations(drop, "drop")
    assert slow[True] > 1.6 * base[True]
    assert slow[False] == pytest.approx(base[False], rel=0.05)


# ---- errors ------------------------------------------------------------------------------------
def test_plugin_init_failure_is_a_clear_error(recorder, emu_lib, tmp_path):
    with pytest.raises(DriverError, match=r"plugin init failed on node \d+: .*abi-recorder: init refused"):
        run_job(recorder, emu_lib, tmp_path, env={"DCCL_ABI_FAIL_INIT": "1"})


@pytest.mark.parametrize("abi", [5, 6])
def test_plugin_of_an_older_abi_is_a_clear_error(abi, recorder_v4_only, emu_lib, tmp_path):
    with pytest.raises(DriverError, match=rf"cannot open profiler plugin .*librecorder4.so \(ABI v{abi}\): "
                                          rf".*does not export ncclProfiler_v{abi}"):
        run_job(recorder_v4_only, emu_lib, tmp_path, abi=abi)
