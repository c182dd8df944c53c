"""ctypes binding of the NCCL profiler-call emulator (``libdccl-nccl-emu.so``).

Build it with ``make -C nccl_profiler_plugin emulator``. Example::

    emu = Emulator(plugin_path, abi=6)
    comm = emu.comm_init(comm_hash=0x1234, name="dp", nnodes=1, nranks=8, rank=0, threads=2)
    ops = Emulator.ops(1000)               # numpy structured array, zero-filled
    ops["func"] = FUNCS.index("AllReduce") ...
    emu.run(comm, ops); emu.sync(comm); emu.comm_finalize(comm); emu.close()

``run`` passes the numpy buffer straight to C (no per-operation Python work), so a driver can
replay hundreds of thousands of collectives per second through a real plugin.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

__all__ = ["EMU_OP_DTYPE", "Emulator", "EmulatorError", "FLAGS", "library_path"]


# Mirrors emu_coll_t in nccl_emu.h (64 bytes).
EMU_OP_DTYPE = np.dtype([
    ("func", "<i4"), ("datatype", "<i4"), ("algo", "<i4"), ("proto", "<i4"),
    ("n_channels", "<i4"), ("n_warps", "<i4"), ("root", "<i4"), ("flags", "<u4"),
    ("count", "<u8"), ("seq_number", "<u8"), ("gpu_start_ns", "<u8"), ("gpu_end_ns", "<u8"),
])
assert EMU_OP_DTYPE.itemsize == 64

FLAGS = {
    "NULL_PARENT": 0x1, "NULL_KCH_PARENT": 0x2, "NO_KERNEL": 0x4,
    "CROSS_NODE": 0x8, "PXN": 0x10, "NO_GPU_TIMER": 0x20,
    "COLLNET": 0x40, "TAGGED": 0x80, "SYMMETRIC": 0x100, "CE": 0x200, "PHASES": 0x400,
    "STALE_PTIMER": 0x800, "NO_COLL_EVENT": 0x1000, "NET": 0x2000,
}


class EmulatorError(RuntimeError):
    pass


def library_path() -> Path:
    """The emulator library, built in place (and shipped in the wheel) next to this file."""
    return Path(__file__).with_name("libdccl-nccl-emu.so")


class Emulator:
    """One loaded plugin, driven through the emulator's batch API."""

    def __init__(self, plugin_path: str | Path, abi: int = 6, *, lib: str | Path | None = None):
        self._lib = ctypes.CDLL(str(lib or library_path()))
        L = self._lib
        L.emu_open.restype = ctypes.c_void_p
        L.emu_open.argtypes = [ctypes.c_char_p, ctypes.c_int]
        L.emu_error.restype = ctypes.c_char_p
        L.emu_comm_init.restype = ctypes.c_int
        L.emu_comm_init.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p,
                                    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        L.emu_run_colls.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        L.emu_sync.argtypes = [ctypes.c_void_p, ctypes.c_int]
        L.emu_comm_finalize.argtypes = [ctypes.c_void_p, ctypes.c_int]
        L.emu_close.argtypes = [ctypes.c_void_p]
        L.emu_mask.argtypes = [ctypes.c_void_p]
        L.emu_plugin_name.restype = ctypes.c_char_p
        L.emu_plugin_name.argtypes = [ctypes.c_void_p]
        L.emu_plugin_stats.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        L.emu_plugin_calls.restype = ctypes.c_uint64
        L.emu_plugin_calls.argtypes = [ctypes.c_void_p]
        self._emu = L.emu_open(str(plugin_path).encode(), abi)
        if not self._emu:
            raise EmulatorError(L.emu_error().decode())

    @staticmethod
    def ops(n: int) -> np.ndarray:
        return np.zeros(n, dtype=EMU_OP_DTYPE)

    def comm_init(self, comm_hash: int, name: str | None, nnodes: int, nranks: int, rank: int,
                  threads: int = 1) -> int:
        cid = self._lib.emu_comm_init(self._emu, comm_hash, name.encode() if name is not None else None,
                                      nnodes, nranks, rank, threads)
        if cid < 0:
            raise EmulatorError(self._lib.emu_error().decode())
        return cid

    def run(self, comm: int, ops: np.ndarray) -> None:
        ops = np.ascontiguousarray(ops, dtype=EMU_OP_DTYPE)
        if self._lib.emu_run_colls(self._emu, comm, ops.ctypes.data, len(ops)) != 0:
            raise EmulatorError(f"bad communicator id {comm}")

    def sync(self, comm: int) -> None:
        self._lib.emu_sync(self._emu, comm)

    def comm_finalize(self, comm: int) -> None:
        self._lib.emu_comm_finalize(self._emu, comm)

    @property
    def mask(self) -> int:
        return self._lib.emu_mask(self._emu)

    @property
    def plugin_name(self) -> str:
        return self._lib.emu_plugin_name(self._emu).decode()

    @property
    def plugin_calls(self) -> int:
        return self._lib.emu_plugin_calls(self._emu)

    def stats(self, dtype: np.dtype | None = None) -> np.ndarray | None:
        """The plugin's dynamicclProfilerStats() as one record of ``dtype`` (raw bytes if None)."""
        buf = ctypes.create_string_buffer(128)
        if self._lib.emu_plugin_stats(self._emu, buf) != 0:
            return None
        raw = np.frombuffer(buf.raw, dtype=np.uint8)
        return raw if dtype is None else raw.view(dtype)[0]

    def close(self) -> None:
        if self._emu:
            self._lib.emu_close(self._emu)
            self._emu = None
