"""The plugin → collector wire format: the one source of truth for the record layout.

The C header ``dynamiccl/nccl_profiler_plugin/include/dynamiccl_record.h`` is *generated* from this
file (``python -m dynamiccl.collector.wire_format > dynamiccl/nccl_profiler_plugin/include/dynamiccl_record.h``);
``tests/nccl_profiler_plugin/test_record_layout.py`` checks that the committed header is up to date and that a
compiled C program reports the same offsets and sizes as the numpy dtypes below.

Stream layout (all integers little-endian)::

    frame  := header record{n_records}
    header := magic:u32 version:u16 record_size:u16 n_records:u32 flags:u32   (16 bytes)
    record := 128 bytes; byte 0 is ``kind`` and selects one of the layouts below

Every connection starts with one PROCESS record, then one COMM record per live
communicator (re-sent after every reconnect), then COLL/P2P records and a STATS record
about once a second. ``record_seq`` is a per-process counter assigned when a record enters
the plugin's ring; a jump in it at the collector is a delivery gap (records lost between
the ring and the socket, e.g. while the collector was down).
"""
from __future__ import annotations

import numpy as np

from dynamiccl.contracts.collectives import ALGOS, FUNCS, PROTOS

__all__ = [
    "MAGIC", "VERSION", "RECORD_SIZE", "HEADER_DTYPE", "EVENT_DTYPE", "COMM_DTYPE",
    "PROCESS_DTYPE", "STATS_DTYPE", "PEER_DTYPE", "Kind", "TimingSource", "EventFlags", "FUNCS", "DATATYPES",
    "DATATYPE_SIZES", "ALGOS", "PROTOS", "UNKNOWN", "MAX_RECORDS_PER_FRAME", "c_header", "kernel_variant_hash",
]

MAGIC = 0x4C434344  # b"DCCL" read as a little-endian u32
VERSION = 1
RECORD_SIZE = 128
MAX_RECORDS_PER_FRAME = 8192
UNKNOWN = 255  # enum value for a string the plugin did not recognise / field not known


class Kind:
    COLL = 1
    P2P = 2
    COMM = 3
    PROCESS = 4
    STATS = 5
    PEER = 6  # per-peer network timing of one operation (opt-in: ProxyOp|ProxyStep in DYNAMICCL_EVENT_MASK)


class TimingSource:
    NONE = 0        # only the CPU enqueue time is known (KernelCh disabled or lost)
    KERNEL_GPU = 1  # GPU %globaltimer start/stop from KernelCh events (accurate)
    KERNEL_CPU = 2  # host clock at KernelCh start/stop (late by the proxy polling delay)


class EventFlags:
    """Bits of the COLL/P2P record's ``flags`` field."""
    STALE = 1  # emitted by the plugin's stale-slot reaper or at finalize: KernelCh children were
               # lost; timing_source is NONE and gpu_*/channels_seen hold what had been seen
    SYMMETRIC = 2  # profiler v7 (NCCL 2.31+): a symmetric-memory kernel ran it (coll.isSymColl)
    COPY_ENGINE = 4  # a copy-engine collective (v6+ CeColl event, only with DYNAMICCL_EVENT_MASK bit 4096):
                     # counted and enqueue-timed only (timing NONE, algo/proto UNKNOWN)
    TIMING_SUSPECT = 8  # a KernelCh pTimer broke the channel's kernel order (NCCL 2.28 after a send/recv to
                        # self) or stopped before it started: timing_source is NONE, gpu_* kept as seen
    API_LEVEL = 16  # from the API call alone: NCCL ran it with no Coll event (2.29+: every ncclBroadcast);
                    # enqueue-timed only (timing NONE, algo/proto UNKNOWN, n_channels 0)


# Enum tables: index = wire code. Strings exactly as NCCL passes them (nccl-plugin-abi.md §1.6); the
# collective/algorithm/protocol tables are the contracts' (one table for every stage).
DATATYPES = ("ncclInt8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64", "ncclFloat16",
             "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2",
             "ncclUint8")
DATATYPE_SIZES = (1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1, 1)

HEADER_DTYPE = np.dtype([
    ("magic", "<u4"), ("version", "<u2"), ("record_size", "<u2"),
    ("n_records", "<u4"), ("flags", "<u4"),
])

# kind = COLL or P2P. For P2P, `root` holds the peer rank and algo/proto are UNKNOWN.
EVENT_DTYPE = np.dtype([
    ("kind", "u1"), ("func", "u1"), ("datatype", "u1"), ("algo", "u1"),
    ("proto", "u1"), ("n_channels", "u1"), ("n_warps", "u1"), ("timing_source", "u1"),
    ("rank", "<i4"), ("nranks", "<i4"), ("nnodes", "<i4"), ("pid", "<u4"),
    ("root", "<i4"), ("tuner_config_version", "<u4"),
    ("channels_seen", "<u2"), ("flags", "<u2"),
    ("kernel_variant", "<u4"),  # profiler v7 (NCCL 2.31+): FNV-1a 32-bit hash of the Coll's kernelVariant name
                                # (first 64 bytes; kernel_variant_hash() below), 0 none/older NCCL/older records
    ("comm_hash", "<u8"), ("seq_number", "<u8"), ("count", "<u8"), ("bytes", "<u8"),
    ("enqueue_ns", "<u8"),    # CPU CLOCK_REALTIME at the Coll/P2p startEvent
    ("gpu_start_ns", "<u8"),  # first KernelCh start pTimer (GPU globaltimer), 0 if none
    ("gpu_end_ns", "<u8"),    # last KernelCh stop pTimer, 0 if none
    ("cpu_end_ns", "<u8"),    # host CLOCK_REALTIME when the last KernelCh stopped, 0 if none
    ("record_seq", "<u8"),
    ("user_tag", "<u8"),      # profiler v7 (NCCL 2.31+): the call's userProfilerTag; 0 untagged/older NCCL
    ("sync_wait_ns", "<u8"),  # profiler v7 with KernelPhase in the mask: the longest initial_sync phase over the
                              # channels (GPU ns; the rank's wait for its peers in a symmetric kernel), 0 if none
])

COMM_DTYPE = np.dtype([
    ("kind", "u1"), ("pad", "u1", (3,)), ("pid", "<u4"), ("comm_hash", "<u8"),
    ("rank", "<i4"), ("nranks", "<i4"), ("nnodes", "<i4"), ("reserved0", "<u4"),
    ("record_seq", "<u8"), ("comm_name", "S88"),
])

PROCESS_DTYPE = np.dtype([
    ("kind", "u1"), ("abi_version", "u1"), ("pad", "u1", (2,)), ("pid", "<u4"),
    ("start_ns", "<u8"), ("record_seq", "<u8"), ("host", "S56"), ("job_id", "S48"),
])

STATS_DTYPE = np.dtype([
    ("kind", "u1"), ("pad", "u1", (3,)), ("pid", "<u4"), ("time_ns", "<u8"),
    ("record_seq", "<u8"),
    ("events_dropped_pool_full", "<u8"),  # Coll/P2p/KernelCh starts refused: slot pool full
    ("records_dropped_ring_full", "<u8"), # finished records refused: send ring full
    ("records_undelivered", "<u8"),       # records taken from the ring but not sent (no collector)
    ("records_sent", "<u8"), ("records_emitted", "<u8"), ("events_stale", "<u8"),
    ("reconnects", "<u8"), ("sampled_out", "<u8"),
    ("kernel_ch_rejected", "<u8"),       # KernelCh starts refused (bad or duplicate channel id)
    ("kernel_ch_timing_suspect", "<u8"), # records flagged TIMING_SUSPECT (KernelCh pTimers out of order)
    ("colls_without_event", "<u8"),      # collective calls (CollApi, NCCL 2.28+) with no Coll/CeColl event
    ("reserved", "<u8", (2,)),           # [0] connection ordinal (1, 2, ...); [1] chained-profiler handles gone stale
])

# kind = PEER: one per (operation, peer, direction) whose proxy ops the plugin saw, after the operation's
# own record (same comm_hash and seq_number). The three state times are the time the operation's proxy
# steps to/from that peer spent in each ProxyStep state, summed over its steps and channels (host
# CLOCK_MONOTONIC ns): send (is_send 1): GPU wait, peer wait, wait (network); receive: wait (network),
# flush wait, GPU wait. record_seq sits where the event record has it (same ring).
PEER_DTYPE = np.dtype([
    ("kind", "u1"), ("is_send", "u1"), ("parent_kind", "u1"), ("func", "u1"), ("pid", "<u4"),
    ("rank", "<i4"), ("peer", "<i4"), ("comm_hash", "<u8"), ("seq_number", "<u8"),
    ("proxy_ops", "<u4"), ("steps", "<u4"),
    ("bytes", "<u8"),          # sum of the steps' transSize (ProxyStep SendWait / RecvWait)
    ("state_ns", "<u8", (3,)),
    ("enqueue_ns", "<u8"),     # the operation's enqueue time (its event record's enqueue_ns)
    ("reserved", "<u8", (3,)),
    ("record_seq", "<u8"),
    ("reserved2", "<u8", (2,)),
])
assert PEER_DTYPE.fields["record_seq"][1] == EVENT_DTYPE.fields["record_seq"][1]

for _dt in (EVENT_DTYPE, COMM_DTYPE, PROCESS_DTYPE, STATS_DTYPE, PEER_DTYPE):
    assert _dt.itemsize == RECORD_SIZE, (_dt.names[:2], _dt.itemsize)
assert HEADER_DTYPE.itemsize == 16

def kernel_variant_hash(name: str | bytes) -> int:
    """The ``kernel_variant`` field for a v7 kernelVariant name: 32-bit FNV-1a of its first 64 bytes (0 is
    reserved for "none", so a name hashing to 0 is recorded as 1).

    >>> kernel_variant_hash("sym") != kernel_variant_hash("default")
    True
    """
    h = 2166136261
    for b in (name.encode() if isinstance(name, str) else name)[:64]:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h or 1


_C_TYPES = {"u1": "uint8_t", "<u2": "uint16_t", "<u4": "uint32_t", "<i4": "int32_t",
            "<u8": "uint64_t", "|u1": "uint8_t"}


def _c_struct(name: str, dtype: np.dtype) -> str:
    lines = [f"typedef struct {name} {{"]
    for field in dtype.names:
        sub, _off = dtype.fields[field][:2]
        if sub.kind == "S":
            lines.append(f"  char {field}[{sub.itemsize}];")
        elif sub.subdtype is not None:
            base, shape = sub.subdtype
            lines.append(f"  {_C_TYPES[base.str]} {field}[{shape[0]}];")
        else:
            lines.append(f"  {_C_TYPES[sub.str]} {field};")
    lines.append(f"}} {name};")
    lines.append(f"_Static_assert(sizeof({name}) == {dtype.itemsize}, \"{name} size\");")
    return "\n".join(lines)


def _c_enum(prefix: str, names: tuple[str, ...]) -> str:
    body = "\n".join(f"  DCCL_{prefix}_{n.upper()} = {i}," for i, n in enumerate(names))
    strings = ", ".join(f'"{n}"' for n in names)
    return (f"enum {{\n{body}\n  DCCL_{prefix}_COUNT = {len(names)}\n}};\n"
            f"static const char* const dccl_{prefix.lower()}_names[] = {{{strings}}};")


def c_header() -> str:
    """Return the C header text for the wire format (generated; do not edit by hand)."""
    parts = [
        "/* GENERATED by `python -m dynamiccl.collector.wire_format` from dynamiccl/collector/wire_format.py.",
        "   Do not edit: change the Python spec and regenerate. */",
        "#ifndef DYNAMICCL_RECORD_H_", "#define DYNAMICCL_RECORD_H_", "#include <stdint.h>", "",
        f"#define DCCL_WIRE_MAGIC 0x{MAGIC:08X}u",
        f"#define DCCL_WIRE_VERSION {VERSION}",
        f"#define DCCL_RECORD_SIZE {RECORD_SIZE}",
        f"#define DCCL_MAX_RECORDS_PER_FRAME {MAX_RECORDS_PER_FRAME}",
        f"#define DCCL_UNKNOWN {UNKNOWN}", "",
        *(f"#define DCCL_KIND_{k} {getattr(Kind, k)}" for k in ("COLL", "P2P", "COMM", "PROCESS", "STATS", "PEER")),
        *(f"#define DCCL_TIMING_{k} {getattr(TimingSource, k)}" for k in ("NONE", "KERNEL_GPU", "KERNEL_CPU")),
        "#define DCCL_FLAG_STALE " + str(EventFlags.STALE),
        "#define DCCL_FLAG_SYMMETRIC " + str(EventFlags.SYMMETRIC),
        "#define DCCL_FLAG_COPY_ENGINE " + str(EventFlags.COPY_ENGINE),
        "#define DCCL_FLAG_TIMING_SUSPECT " + str(EventFlags.TIMING_SUSPECT),
        "#define DCCL_FLAG_API_LEVEL " + str(EventFlags.API_LEVEL),
        "",
        _c_enum("FUNC", FUNCS), _c_enum("DTYPE", DATATYPES),
        "static const uint8_t dccl_dtype_sizes[] = {" + ", ".join(map(str, DATATYPE_SIZES)) + "};",
        _c_enum("ALGO", ALGOS), _c_enum("PROTO", PROTOS), "",
        _c_struct("dccl_frame_header_t", HEADER_DTYPE), "",
        _c_struct("dccl_event_record_t", EVENT_DTYPE), "",
        _c_struct("dccl_comm_record_t", COMM_DTYPE), "",
        _c_struct("dccl_process_record_t", PROCESS_DTYPE), "",
        _c_struct("dccl_stats_record_t", STATS_DTYPE), "",
        _c_struct("dccl_peer_record_t", PEER_DTYPE), "",
        "#endif /* DYNAMICCL_RECORD_H_ */", "",
    ]
    return "\n".join(parts)


if __name__ == "__main__":
    import sys
    sys.stdout.write(c_header())
