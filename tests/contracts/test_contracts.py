"""The contracts table against every copy that cannot import it: the C tuner's token table and limits, the
generated record header, NCCL's ncclFunc_t enum, and the defaults of the stages that name an address."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dynamiccl.contracts import addresses, tuner_file
from dynamiccl.contracts.collectives import (ALGOS, COLLECTIVES, COST_FUNCS, FUNCS, PROTOS, TUNER_FUNCS,
                                             bucket_range, busbw_factor, collective, size_bucket, tuner_token)

REPO = Path(__file__).resolve().parents[2]
RULES_C = (REPO / "dynamiccl/nccl_tuner_plugin/src/rules.c").read_text()
INTERNAL_H = (REPO / "dynamiccl/nccl_tuner_plugin/src/internal.h").read_text()
TUNER_ABI_H = (REPO / "dynamiccl/nccl_tuner_plugin/include/nccl_tuner_abi.h").read_text()
RECORD_H = (REPO / "dynamiccl/nccl_profiler_plugin/include/dynamiccl_record.h").read_text()


def c_strings(src: str, array: str) -> tuple[str, ...]:
    m = re.search(rf"{array}\s*\[[^\]]*\]\s*=\s*\{{([^}}]*)\}}", src)
    assert m, f"{array} not found"
    return tuple(re.findall(r'"([^"]*)"', m.group(1)))


def c_define(src: str, name: str) -> str:
    m = re.search(rf"^#define {name}\s+(.+?)\s*(?:/\*.*)?$", src, re.M)
    assert m, f"#define {name} not found"
    return m.group(1)


def c_enum(src: str, prefix: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(rf"\b({prefix}\w+)\s*=\s*(\d+)", src)}


# ---- the C tuner -------------------------------------------------------------------------------------
def test_the_c_tuner_token_tables_are_the_contracts_tables():
    assert c_strings(RULES_C, "FUNC_NAMES") == TUNER_FUNCS
    assert c_strings(RULES_C, "ALGO_NAMES") == ALGOS
    assert c_strings(RULES_C, "PROTO_NAMES") == PROTOS
    assert int(c_define(INTERNAL_H, "DCT_NFUNC")) == len(TUNER_FUNCS)


def test_the_c_tuner_maps_ncclfunc_to_the_contracts_tuner_index():
    """dct_func_index: a range of ncclFunc_t values that map to themselves, plus single mappings."""
    enum = c_enum(TUNER_ABI_H, "ncclFunc")
    body = re.search(r"int dct_func_index\(int f\) \{(.*?)\n\}", RULES_C, re.S).group(1)
    mapping: dict[int, int] = {}
    for lo, hi in re.findall(r"f >= (ncclFunc\w+) && f <= (ncclFunc\w+)\) return f;", body):
        mapping |= {v: v for v in range(enum[lo], enum[hi] + 1)}
    for name, idx in re.findall(r"f == (ncclFunc\w+)\) return (\d+);", body):
        mapping[enum[name]] = int(idx)
    expected = {c.nccl_func: c.tuner_index for c in COLLECTIVES if c.tuner_index is not None}
    assert mapping == expected


def test_ncclfunc_values_are_ncclfunc_t():
    enum = c_enum(TUNER_ABI_H, "ncclFunc")
    for c in COLLECTIVES:
        key = "ncclFunc" + c.name
        if key in enum:
            assert enum[key] == c.nccl_func, c.name
    assert len({c.nccl_func for c in COLLECTIVES}) == len(COLLECTIVES)


def test_the_c_tuner_limits_are_the_tuner_file_constants():
    assert int(c_define(INTERNAL_H, "DCT_MAX_RULES")) == tuner_file.MAX_RULES
    assert int(c_define(INTERNAL_H, "DCT_MAX_VERSIONS")) == tuner_file.MAX_VERSIONS
    assert c_define(INTERNAL_H, "DCT_MAX_FILE_BYTES") == f"(1 << {tuner_file.MAX_FILE_BYTES.bit_length() - 1})"
    assert tuner_file.MAX_FILE_BYTES & (tuner_file.MAX_FILE_BYTES - 1) == 0
    assert int(c_define(INTERNAL_H, "DCT_MAX_CHANNELS")) == tuner_file.MAX_CHANNELS
    assert "DCT_DEFAULT_PATH" not in INTERNAL_H  # the default is the runtime_paths rule (test_runtime_paths.py)
    assert re.search(r"char line\[(\d+)\]", RULES_C).group(1) == str(tuner_file.MAX_LINE_CHARS + 1)


# ---- the record header -------------------------------------------------------------------------------
def test_the_record_header_names_the_contracts_tables_in_wire_order():
    assert c_strings(RECORD_H, "dccl_func_names") == FUNCS
    assert c_strings(RECORD_H, "dccl_algo_names") == ALGOS
    assert c_strings(RECORD_H, "dccl_proto_names") == PROTOS
    funcs = c_enum(RECORD_H, "DCCL_FUNC_")
    assert all(funcs[f"DCCL_FUNC_{c.name.upper()}"] == c.code for c in COLLECTIVES)
    assert funcs["DCCL_FUNC_COUNT"] == len(COLLECTIVES)


def test_the_record_layout_header_is_generated_from_the_wire_format():
    from dynamiccl.collector import wire_format
    assert wire_format.c_header() == RECORD_H
    assert wire_format.FUNCS is FUNCS and wire_format.ALGOS is ALGOS and wire_format.PROTOS is PROTOS


# ---- the Python stages -------------------------------------------------------------------------------
def test_every_stage_uses_the_one_table():
    from dynamiccl.nccl_model import cost_model
    from dynamiccl.nccl_tuner_plugin import config
    from dynamiccl.harness.simulator import tuner_abi
    assert config.FUNCS == TUNER_FUNCS and config.ALGOS is ALGOS and config.PROTOS is PROTOS
    assert cost_model.FUNCS == COST_FUNCS == ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
    assert cost_model.ALGOS is ALGOS and cost_model.PROTOS is PROTOS
    assert tuner_abi.NCCL_FUNC == {c.tuner_token: c.nccl_func for c in COLLECTIVES if c.tuner_token}


def test_the_wire_and_tuner_spellings_of_all_to_all_meet_in_one_row():
    assert collective("AlltoAll") is collective("AllToAll") is collective(FUNCS.index("AlltoAll"))
    assert tuner_token("AlltoAll") == "AllToAll" and "AllToAll" in TUNER_FUNCS and "AlltoAll" in FUNCS
    assert [tuner_token(f) for f in ("Gather", "Scatter", "SendRecv", "Send", "Recv")] == [None] * 5
    with pytest.raises(ValueError, match="unknown collective 'Alltoall'"):
        collective("Alltoall")


def test_busbw_factor_is_the_same_everywhere():
    from dynamiccl.collector.records import busbw_factor as records_busbw
    from dynamiccl.harness.simulator.perf_model import busbw_factor as sim_busbw
    codes = np.arange(len(FUNCS))
    for n in (2, 8, 64):
        expected = [busbw_factor(f, n) for f in FUNCS]
        assert records_busbw(codes, np.full(len(codes), n)).tolist() == pytest.approx(expected)
        assert [sim_busbw(f, n) for f in COST_FUNCS] == pytest.approx([busbw_factor(f, n) for f in COST_FUNCS])
    assert busbw_factor("AllReduce", 8) == 1.75 and busbw_factor("AlltoAll", 4) == 0.75
    assert busbw_factor("Broadcast", 8) == 1.0


def test_one_size_bucket_definition_agrees_at_zero_bytes_and_everywhere_else():
    from dynamiccl.collector.records import size_bucket as records_bucket
    from dynamiccl.retuner.types import bucket_of
    sizes = [0, 1, 2, 3, 4, 1023, 1024, 1025, (1 << 30) - 1, 1 << 30, (1 << 40) + 7]
    assert records_bucket(np.array(sizes, np.uint64)).tolist() == [size_bucket(b) for b in sizes]
    assert [bucket_of(b) for b in sizes] == [size_bucket(b) for b in sizes]
    assert size_bucket(0) == -1 and bucket_range(-1) == (0, 0)
    for b in sizes[1:]:
        lo, hi = bucket_range(size_bucket(b))
        assert lo <= b <= hi


def test_the_stages_default_addresses_are_the_contracts_addresses():
    from dynamiccl.collector import config as cc
    from dynamiccl.detector import config as dc
    from dynamiccl import stack
    from dynamiccl.retuner import config as rc
    assert (cc.DEFAULT_LISTEN, cc.DEFAULT_METRICS, cc.DEFAULT_FEATURES) == (
        addresses.COLLECTOR_LISTEN, addresses.COLLECTOR_METRICS, addresses.COLLECTOR_FEATURES)
    assert (dc.DEFAULT_FEATURES, dc.DEFAULT_METRICS, dc.DEFAULT_SERVE) == (
        addresses.COLLECTOR_FEATURES, addresses.DETECTOR_METRICS, addresses.DETECTOR_EVENTS)
    assert (rc.DEFAULT_FEATURES, rc.DEFAULT_CHANGES, rc.DEFAULT_METRICS) == (
        addresses.COLLECTOR_FEATURES, addresses.DETECTOR_EVENTS, addresses.RETUNER_METRICS)
    assert {k: port for k, (_env, port) in stack.PORT_ENV.items() if k in addresses.PORTS} == addresses.PORTS
    for name in ("COLLECTOR_METRICS", "DETECTOR_METRICS", "RETUNER_METRICS", "ALERT_LOG"):
        assert int(getattr(addresses, name).rsplit(":", 1)[1]) in addresses.PORTS.values()
