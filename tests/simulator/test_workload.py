"""Workloads: presets, communicator layouts, validation errors that name the field."""
from __future__ import annotations

import copy

import pytest
import yaml

from dynamiccl.harness.simulator import workload as W
from dynamiccl.harness.simulator.workload import WorkloadError

BASE = {
    "name": "t", "topology": "h100-2x8",
    "groups": [{"name": "tp", "layout": "block", "size": 8}, {"name": "dp", "layout": "stride", "size": 2}],
    "schedule": [{"repeat": 2, "ops": [{"group": "tp", "func": "AllReduce", "bytes": 1024, "compute_us": 5}]},
                 {"ops": [{"group": "dp", "func": "AllGather", "bytes": 4096}]}],
}


def test_presets_load_and_have_the_documented_shape():
    assert {"llama7b-tp8-dp2", "llama70b-fsdp", "small"} <= set(W.preset_names())
    w = W.preset("llama7b-tp8-dp2")
    assert w.topology.name == "h100-2x8"
    tp, dp = w.group("tp"), w.group("dp")
    assert all(c.n_nodes == 1 and c.n_ranks == 8 for c in tp.comms)          # TP inside a node
    assert all(c.n_nodes == 2 and c.gpus_per_node == 1 for c in dp.comms)    # DP across nodes
    assert w.n_slots == 194 and w.records_per_step == 3104
    f = W.preset("llama70b-fsdp")
    assert f.topology.name == "h100-8x8" and f.group("fsdp").comms[0].n_ranks == 64
    hashes = [c.comm_hash for c in w.comms]
    assert len(set(hashes)) == len(hashes) and all(h > 0 for h in hashes)
    assert W.preset("llama7b-tp8-dp2").comms[0].comm_hash == hashes[0]        # stable


def test_schedule_is_flattened_and_counts_follow_func():
    w = W.from_dict(BASE)
    assert [op.func for op in w.schedule] == ["AllReduce", "AllReduce", "AllGather"]
    assert w.records_per_step == 16 * 3
    assert w.nominal_step_compute_us() == 10.0


@pytest.mark.parametrize("path, value, message", [
    (("schedule", 0, "ops", 0, "func"), "AllToAll", "schedule[0].ops[0].func"),
    (("schedule", 0, "ops", 0, "bytes"), 1023, "schedule[0].ops[0].bytes=1023 must be a multiple of 2"),
    (("schedule", 1, "ops", 0, "bytes"), 4098, "multiple of 4 (dtype size x 2 ranks for AllGather)"),
    (("schedule", 0, "ops", 0, "group"), "pp", "schedule[0].ops[0].group"),
    (("schedule", 0, "ops", 0, "compute_us"), -1, "schedule[0].ops[0].compute_us"),
    (("schedule", 0, "repeat"), 0, "schedule[0].repeat"),
    (("groups", 0, "size"), 3, "groups[0].size"),
    (("groups", 1, "layout"), "ring", "groups[1].layout"),
    (("dtype",), "float", "dtype must be one of"),
    (("topology",), "h100-9x9", "topology: "),
])
def test_validation_errors_name_the_field(path, value, message):
    d = copy.deepcopy(BASE)
    target = d
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    with pytest.raises(WorkloadError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        W.from_dict(d)


def test_structural_errors():
    d = copy.deepcopy(BASE)
    d["schedule"][0]["ops"][0]["func"] = "Send"
    with pytest.raises(WorkloadError, match=r"schedule\[0\].ops\[0\]: func Send needs a group of 2-rank comms"):
        W.from_dict(d)
    d = copy.deepcopy(BASE)
    d["groups"].append({"name": "odd", "ranks": [[0, 1, 8]]})
    with pytest.raises(WorkloadError, match=r"groups\[2\].ranks\[0\]: ranks must be spread evenly"):
        W.from_dict(d)
    d = copy.deepcopy(BASE)
    d["groups"].append({"name": "big", "ranks": [[0, 16]]})
    with pytest.raises(WorkloadError, match=r"ranks \[16\] outside \[0, 16\)"):
        W.from_dict(d)
    d = copy.deepcopy(BASE)
    d["schedule"][0]["ops"][0]["colour"] = 1
    with pytest.raises(WorkloadError, match=r"schedule\[0\].ops\[0\]: unknown key\(s\) \['colour'\]"):
        W.from_dict(d)
    d = copy.deepcopy(BASE)
    d["groups"][1]["name"] = "tp"
    with pytest.raises(WorkloadError, match=r"groups\[1\].name 'tp' is duplicated"):
        W.from_dict(d)


def test_yaml_errors_name_the_file(tmp_path):
    d = copy.deepcopy(BASE)
    d["schedule"][0]["ops"][0]["bytes"] = -4
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(WorkloadError, match=rf"{p}: schedule\[0\].ops\[0\].bytes must be a positive int"):
        W.load(p)
    with pytest.raises(KeyError, match="unknown workload preset 'nope'"):
        W.load("nope")


def test_topology_override():
    w = W.load("small", topology="a100-2x8")
    assert w.topology.name == "a100-2x8"
    with pytest.raises(WorkloadError, match="outside"):
        W.load("small", topology="h100-1x8")
