"""The real tuner plugin ``.so`` called through NCCL's tuner ABI (ctypes), as the simulator's tuner.

:class:`TunerPlugin` loads a library, checks that it exports ``ncclTunerPlugin_v<abi>`` (4, 5 or 6)
with a name and the functions that ABI requires, and calls ``init`` / ``getCollInfo`` /
``getChunkSize`` / ``finalize`` through that function table exactly as NCCL does (the cost table is a
``float[numAlgo][numProto]`` passed as ``float**``). If the library also exports DynamICCL's control
functions (``dynamiccl_tuner_*``) they are available as methods (reload, staged/applied versions,
apply, stats).

The engine's tuners built on it (:class:`PluginTuner`, :class:`RankTuners`, :class:`TunerDecision`) live in
:mod:`dynamiccl.harness.simulator.engine_tuners` and are importable from here too.

>>> from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, write_configs
>>> import numpy as np, tempfile, os
>>> conf = os.path.join(tempfile.mkdtemp(), "t.conf")
>>> write_configs(conf, [TunerConfig(1, (Rule("AllReduce", 0, 1 << 20, "RING", "LL", 4),))])
>>> p = TunerPlugin.private_copy()             # a private instance (its own globals)
>>> p.configure(conf, mode="agree", poll_ms=0); p.reload(), p.staged_version, p.applied_version
(1, 1, 0)
>>> p.apply_version(1)
>>> ctx = p.init(comm_hash=0xabc, n_ranks=8, n_nodes=1)
>>> table = np.full((7, 3), 50.0, dtype=np.float32); table[6] = -1
>>> out, nch = p.get_coll_info(ctx, "AllReduce", 4096, table)
>>> float(out[1, 0]), nch                      # RING/LL forced to 0 with a 4-channel budget
(0.0, 4)
>>> p.finalize(ctx); p.close()
"""

from __future__ import annotations

import _ctypes
import ctypes
import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np

from dynamiccl.contracts.collectives import COLLECTIVES

__all__ = ["TunerPlugin", "TunerABIError", "STATS_FIELDS", "NCCL_FUNC", "SUPPORTED_ABIS", "MODES"]
#: names that live in engine_tuners (which imports this module), resolved on first access to avoid the cycle
_ENGINE_TUNERS = ("PluginTuner", "RankTuners", "TunerDecision")

SUPPORTED_ABIS = (4, 5, 6)
MODES = {"agree": 0, "epoch": 1, "immediate": 2}
#: ncclFunc_t codes (nccl-plugin-abi.md §2.2) for the collective names of the config file.
NCCL_FUNC = {c.tuner_token: c.nccl_func for c in sorted(COLLECTIVES, key=lambda c: c.nccl_func) if c.tuner_token}
#: dynamiccl_tuner_stats_t (include/dynamiccl_tuner.h), 32 uint64.
STATS_FIELDS = ("control_abi", "mode", "staged_version", "oldest_version", "applied_version", "pending_version",
                "pending_at_ns", "reloads", "reload_errors", "files_missing", "applies", "apply_refused",
                "epoch_late", "contexts", "calls", "decisions", "no_enabled_cell", "chunk_set", "lookup_retries",
                "slots_exhausted")
CONTROL_ABI = 1

_LOGFN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p)
_RTLD_NOW = getattr(os, "RTLD_NOW", 2)
_RTLD_LOCAL = getattr(os, "RTLD_LOCAL", 0)


_LOG: list[tuple[int, str]] = []
_LOG_LOCK = threading.Lock()


def _log(level: int, flags: int, file: bytes | None, line: int, fmt: bytes | None) -> None:
    with _LOG_LOCK:
        _LOG.append((int(level), (fmt or b"").decode(errors="replace")))
        del _LOG[:-1000]


# Module-level, never freed: a plugin keeps the logger pointer NCCL gave its first init for its lifetime.
_LOG_CALLBACK = _LOGFN(_log)


class TunerABIError(RuntimeError):
    """The library is not a usable tuner plugin for the requested ABI; the message says what is wrong."""


# ---- the ABI tables (dynamiccl/nccl_tuner_plugin/include/nccl_tuner_abi.h) ------------------------------------------
_VP = ctypes.c_void_p
_GET_COLL_INFO = ctypes.CFUNCTYPE(ctypes.c_int, _VP, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, _VP, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
_CTX_FN = ctypes.CFUNCTYPE(ctypes.c_int, _VP)
_INIT_V5 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_VP), ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t,
                            _VP, _VP, _VP)
_INIT_V4 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, _VP, ctypes.POINTER(_VP))
_GET_CHUNK = ctypes.CFUNCTYPE(ctypes.c_int, _VP, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.POINTER(ctypes.c_size_t))


class _TunerV4(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", _INIT_V4), ("getCollInfo", _GET_COLL_INFO), ("destroy", _CTX_FN)]


class _TunerV5(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", _INIT_V5), ("getCollInfo", _GET_COLL_INFO),
                ("finalize", _CTX_FN)]


class _TunerV6(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", _INIT_V5), ("getCollInfo", _GET_COLL_INFO),
                ("finalize", _CTX_FN), ("getChunkSize", _GET_CHUNK)]


_TABLES = {4: _TunerV4, 5: _TunerV5, 6: _TunerV6}


class _NvlDomainInfo(ctypes.Structure):
    _fields_ = [("nNvlDomains", ctypes.c_int), ("minRanksPerNvlDomain", ctypes.c_int),
                ("maxRanksPerNvlDomain", ctypes.c_int)]


class _TunerConstants(ctypes.Structure):   # ncclTunerConstants_v5_t: 21 + 63 + 5 * 12 doubles
    _fields_ = [("values", ctypes.c_double * (21 + 63 + 5 * 12))]


def _func_code(func: str | int) -> int:
    if isinstance(func, int):
        return func
    try:
        return NCCL_FUNC[func]
    except KeyError:
        raise ValueError(f"unknown collective {func!r} (expected one of {', '.join(NCCL_FUNC)})") from None


class TunerPlugin:
    """One loaded tuner library, driven through its ``ncclTunerPlugin_v<abi>`` table.

    ``path`` defaults to the built DynamICCL plugin. Raises :class:`TunerABIError` when the symbol is
    missing, the ABI version is not one of :data:`SUPPORTED_ABIS`, or the table lacks a required function,
    and ``OSError`` when the file cannot be loaded. Contexts are plain integers (the plugin's ``void*``).
    """

    def __init__(self, path: str | os.PathLike | None = None, abi: int = 6, *, _private_dir: str | None = None):
        if path is None:
            from dynamiccl import nccl_tuner_plugin
            path = nccl_tuner_plugin.library_path()
        self.path = Path(path)
        self.abi = int(abi)
        self._private_dir = _private_dir
        if self.abi not in SUPPORTED_ABIS:
            raise TunerABIError(f"tuner ABI v{abi} is not supported (supported: "
                                f"{', '.join(f'v{v}' for v in SUPPORTED_ABIS)})")
        if not self.path.is_file():
            raise FileNotFoundError(f"tuner plugin not found at {self.path}")
        self._lib = ctypes.CDLL(str(self.path), mode=_RTLD_NOW | _RTLD_LOCAL)
        symbol = f"ncclTunerPlugin_v{self.abi}"
        try:
            self._table = _TABLES[self.abi].in_dll(self._lib, symbol)
        except ValueError:
            have = [f"v{v}" for v in (7, 6, 5, 4, 3, 2) if hasattr(self._lib, f"ncclTunerPlugin_v{v}")]
            raise TunerABIError(f"{self.path} does not export {symbol} (exports: {', '.join(have) or 'no tuner symbol'})"
                                ) from None
        t = self._table
        if not t.name:
            raise TunerABIError(f"{symbol} in {self.path} has a NULL name")
        missing = [f for f in ("init", "getCollInfo", "destroy" if self.abi == 4 else "finalize") if not getattr(t, f)]
        if missing:
            raise TunerABIError(f"{symbol} in {self.path} has NULL {', '.join(missing)}")
        self.name = t.name.decode(errors="replace")
        self.has_chunk_size = self.abi >= 6 and bool(t.getChunkSize)
        self._contexts: set[int] = set()
        self._lock = threading.Lock()
        self.has_control = hasattr(self._lib, "dynamiccl_tuner_reload")
        if self.has_control:
            self._bind_control()
        self._closed = False

    @classmethod
    def private_copy(cls, path: str | os.PathLike | None = None, abi: int = 6,
                     tmp_dir: str | os.PathLike | None = None) -> "TunerPlugin":
        """A separate instance of the plugin (its own globals), as a separate process would have: the ``.so``
        is copied to a private temporary file before ``dlopen`` (the loader shares one instance per file)."""
        if path is None:
            from dynamiccl import nccl_tuner_plugin
            path = nccl_tuner_plugin.library_path()
        d = tempfile.mkdtemp(prefix="dccl-tuner-", dir=tmp_dir)
        dst = os.path.join(d, Path(path).name)
        shutil.copyfile(path, dst)
        return cls(dst, abi, _private_dir=d)

    # ---- NCCL's side of the ABI ------------------------------------------------------------------------------
    @staticmethod
    def log_messages() -> list[tuple[int, str]]:
        """(level, format string) the plugins passed to NCCL's logger in this process, newest last (at most
        1,000; ctypes cannot read the printf arguments, so they are not expanded)."""
        with _LOG_LOCK:
            return list(_LOG)

    def init(self, comm_hash: int = 0, n_ranks: int = 1, n_nodes: int = 1) -> int:
        """Call the table's ``init`` as NCCL does at communicator creation; returns the context."""
        ctx = _VP()
        logfn = ctypes.cast(_LOG_CALLBACK, _VP)
        if self.abi == 4:
            rc = self._table.init(n_ranks, n_nodes, logfn, ctypes.byref(ctx))
        else:
            nvl = _NvlDomainInfo(1, n_ranks, n_ranks)
            consts = _TunerConstants()
            rc = self._table.init(ctypes.byref(ctx), comm_hash & (2**64 - 1), n_ranks, n_nodes, logfn,
                                  ctypes.cast(ctypes.byref(nvl), _VP), ctypes.cast(ctypes.byref(consts), _VP))
        if rc != 0:
            raise TunerABIError(f"{self.name}: init returned {rc} (NCCL would fail communicator creation)")
        c = ctx.value or 0
        with self._lock:
            self._contexts.add(c)
        return c

    def get_coll_info(self, ctx: int, func: str | int, nbytes: int, cost_table: np.ndarray, *,
                      num_pipe_ops: int = 1, reg_buff: int = 0) -> tuple[np.ndarray, int]:
        """One ``getCollInfo`` call on a copy of ``cost_table`` (``float[numAlgo][numProto]`` µs, −1 disabled);
        returns the table as the plugin left it and ``nChannels`` (0 = NCCL's)."""
        table = np.ascontiguousarray(cost_table, dtype=np.float32).copy()
        if table.ndim != 2:
            raise ValueError(f"cost table must be 2-D (numAlgo, numProto), got shape {table.shape}")
        nch = ctypes.c_int(0)
        rc = self._table.getCollInfo(ctx, _func_code(func), int(nbytes), num_pipe_ops, table.ctypes.data,
                                     table.shape[0], table.shape[1], reg_buff, ctypes.byref(nch))
        if rc != 0:
            raise TunerABIError(f"{self.name}: getCollInfo returned {rc} (NCCL would fail the collective)")
        return table, int(nch.value)

    def get_chunk_size(self, ctx: int, func: str | int, nbytes: int, algo: int, proto: int, n_channels: int,
                       chunk: int) -> int:
        """v6 ``getChunkSize``: the chunk after the plugin had its say (``chunk`` unchanged without v6 or when
        the table's pointer is NULL)."""
        if not self.has_chunk_size:
            return int(chunk)
        c = ctypes.c_size_t(int(chunk))
        rc = self._table.getChunkSize(ctx, _func_code(func), int(nbytes), int(algo), int(proto), int(n_channels),
                                      ctypes.byref(c))
        if rc != 0:
            raise TunerABIError(f"{self.name}: getChunkSize returned {rc}")
        return int(c.value)

    def finalize(self, ctx: int) -> None:
        with self._lock:
            self._contexts.discard(ctx)
        fn = self._table.destroy if self.abi == 4 else self._table.finalize
        rc = fn(ctx)
        if rc != 0:
            raise TunerABIError(f"{self.name}: finalize returned {rc}")

    def close(self) -> None:
        """Finalize every context still open, then unload the library (and delete a private copy)."""
        if self._closed:
            return
        for c in list(self._contexts):
            self.finalize(c)
        self._closed = True
        try:
            _ctypes.dlclose(self._lib._handle)
        except OSError:
            pass
        if self._private_dir:
            shutil.rmtree(self._private_dir, ignore_errors=True)

    def __enter__(self) -> "TunerPlugin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- DynamICCL control functions ---------------------------------------------------------------------------
    def _bind_control(self) -> None:
        L = self._lib
        u64 = ctypes.c_uint64
        for name, res, args in (
                ("dynamiccl_tuner_configure", ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]),
                ("dynamiccl_tuner_reload", ctypes.c_int, []),
                ("dynamiccl_tuner_staged_version", u64, []),
                ("dynamiccl_tuner_oldest_version", u64, []),
                ("dynamiccl_tuner_has_version", ctypes.c_int, [u64]),
                ("dynamiccl_tuner_prepare_version", ctypes.c_int, [u64]),
                ("dynamiccl_tuner_apply_version", ctypes.c_int, [u64]),
                ("dynamiccl_tuner_applied_version", u64, []),
                ("dynamiccl_tuner_config_version", ctypes.c_uint32, [u64]),
                ("dynamiccl_tuner_stats", None, [ctypes.c_void_p]),
                ("dynamiccl_tuner_last_error", ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t])):
            fn = getattr(L, name)
            fn.restype = res
            fn.argtypes = args
        st = (u64 * 32)()
        L.dynamiccl_tuner_stats(st)
        if st[0] != CONTROL_ABI:
            raise TunerABIError(f"{self.path}: control ABI {st[0]}, this binding speaks {CONTROL_ABI}")

    def _need_control(self) -> ctypes.CDLL:
        if not self.has_control:
            raise TunerABIError(f"{self.path} has no DynamICCL control functions (not the DynamICCL tuner?)")
        return self._lib

    def configure(self, path: str | os.PathLike | None = None, *, mode: str | None = None,
                  poll_ms: int | None = None) -> None:
        """Override ``DYNAMICCL_TUNER_CONFIG`` / ``_APPLY`` / ``_POLL_MS`` for this instance."""
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        rc = self._need_control().dynamiccl_tuner_configure(
            None if path is None else os.fsencode(path), -1 if mode is None else MODES[mode],
            -1 if poll_ms is None else int(poll_ms))
        if rc != 0:
            raise ValueError(f"tuner configure refused path={path!r} mode={mode!r} poll_ms={poll_ms!r}")
        if path is not None:
            self._config_file = Path(path)

    @property
    def config_file(self) -> Path:
        """The config file this instance reads (set by :meth:`configure`, else the environment's)."""
        if getattr(self, "_config_file", None) is not None:
            return self._config_file
        from dynamiccl import nccl_tuner_plugin
        return nccl_tuner_plugin.config_path()

    def reload(self) -> int:
        """Re-read the config file if it changed: 1 loaded, 0 unchanged/absent, −1 rejected (last good kept)."""
        return int(self._need_control().dynamiccl_tuner_reload())

    @property
    def staged_version(self) -> int:
        return int(self._need_control().dynamiccl_tuner_staged_version())

    @property
    def oldest_version(self) -> int:
        return int(self._need_control().dynamiccl_tuner_oldest_version())

    @property
    def applied_version(self) -> int:
        return int(self._need_control().dynamiccl_tuner_applied_version())

    def has_version(self, version: int) -> bool:
        return bool(self._need_control().dynamiccl_tuner_has_version(int(version)))

    def prepare_version(self, version: int) -> bool:
        """Pin ``version`` until the next :meth:`apply_version` (True if usable here; see the agreement hook)."""
        return bool(self._need_control().dynamiccl_tuner_prepare_version(int(version)))

    def apply_version(self, version: int) -> None:
        """Make ``version`` the applied one (agree mode). Raises ``ValueError`` when it is not staged."""
        if self._need_control().dynamiccl_tuner_apply_version(int(version)) != 0:
            raise ValueError(self.last_error() or f"cannot apply version {version}")

    def config_version(self, comm_hash: int = 0) -> int:
        """What the profiler plugin puts in ``tuner_config_version`` for this communicator."""
        return int(self._need_control().dynamiccl_tuner_config_version(comm_hash & (2**64 - 1)))

    def stats(self) -> dict[str, int]:
        st = (ctypes.c_uint64 * 32)()
        self._need_control().dynamiccl_tuner_stats(st)
        return {k: int(st[i]) for i, k in enumerate(STATS_FIELDS)}

    def last_error(self) -> str:
        buf = ctypes.create_string_buffer(512)
        self._need_control().dynamiccl_tuner_last_error(buf, len(buf))
        return buf.value.decode(errors="replace")


def __getattr__(name: str):
    if name in _ENGINE_TUNERS:
        from dynamiccl.harness.simulator import engine_tuners
        return getattr(engine_tuners, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
