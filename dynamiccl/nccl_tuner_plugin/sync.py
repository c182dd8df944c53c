"""The agreement hook: every rank switches to the same tuner config version at the same step boundary.

Why: all ranks of a communicator must pick the same algorithm, protocol and channels for the same
collective, or NCCL hangs or corrupts data. The retuner writes a new config file; each rank's plugin
*stages* it whenever it happens to read it (delivery to one rank may be late or lost). The hook turns
staged versions into one *applied* version, identically on every rank:

1. all-reduce MIN over ranks of each rank's newest staged version → ``v`` (a version every rank has);
2. if ``v`` differs from the applied version (identical on every rank, by induction): each rank pins ``v``
   (``prepare``: still staged here, not dropped by a concurrent reload) and a second all-reduce MIN of
   the pin results decides: all ranks apply ``v``, or none does;
   ``v`` below the applied version (a rank that has no file yet, or refused a torn or empty one) keeps the
   applied version: versions only grow (a revert is a new version without rules), so going back, and
   above all to 0 = NCCL's defaults on every rank, is never what the retuner asked for;
3. ranks issue their next collectives after the hook returns, so every collective of the new step is
   tuned with ``v`` on every rank, and every collective before it with the previous version.

In PyTorch, one line at a step boundary (all ranks, same place in the program; the default group is
the world, which covers every communicator the plugin tunes)::

    import dynamiccl.nccl_tuner_plugin.sync
    for batch in loader:
        dynamiccl.nccl_tuner_plugin.sync.agree()          # returns the applied version
        loss = model(batch); loss.backward(); opt.step()

Other frameworks call :func:`agree_with` with their own MIN all-reduce of a list of ints.

>>> class FakePlugin:                      # what a rank's plugin answers (see dynamiccl.harness.simulator.tuner_abi)
...     def __init__(self, staged): self.staged_version, self.applied_version = staged, 0
...     def prepare_version(self, v): return v <= self.staged_version
...     def apply_version(self, v): self.applied_version = v
>>> ranks = [FakePlugin(7), FakePlugin(5)]   # rank 1 has not seen versions 6 and 7 yet
>>> run_ranks(ranks)                         # one thread per rank, an in-memory MIN all-reduce
[5, 5]
>>> ranks[1].staged_version = 7; run_ranks(ranks)
[7, 7]
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Protocol, Sequence

__all__ = ["agree", "agree_with", "find_plugin", "PluginControl", "run_ranks", "AgreementError"]

log = logging.getLogger("dynamiccl.nccl_tuner_plugin.sync")


class AgreementError(RuntimeError):
    pass


class _Control(Protocol):
    @property
    def staged_version(self) -> int: ...

    @property
    def applied_version(self) -> int: ...

    def prepare_version(self, version: int) -> bool: ...

    def apply_version(self, version: int) -> None: ...


def agree_with(all_reduce_min: Callable[[Sequence[int]], Sequence[int]], plugin: _Control | None) -> int:
    """The agreement step with a caller-supplied collective ``all_reduce_min(list[int]) -> list[int]``
    (element-wise MIN over all ranks). ``plugin`` None (no tuner plugin in this process) takes part with
    version 0, so the other ranks stay on NCCL's choice too. Returns the applied version.

    Every rank must call it at the same point of its collective sequence: it issues one all-reduce, or
    two when the version changes (the decision to issue the second is the same on every rank)."""
    staged = plugin.staged_version if plugin is not None else 0
    applied = plugin.applied_version if plugin is not None else 0
    v = int(all_reduce_min([staged])[0])
    if v == applied:
        return applied
    if v < applied:   # a rank lacks the applied version (no file yet, torn or refused): keep it, never revert
        log.warning("a rank has only tuner config version %d staged (this rank applies %d); keeping %d",
                    v, applied, applied)
        return applied
    ok = plugin.prepare_version(v) if plugin is not None else v == 0
    if int(all_reduce_min([1 if ok else 0])[0]) == 1:
        if plugin is not None:
            try:
                plugin.apply_version(v)
            except (AgreementError, ValueError) as e:   # e.g. the plugin is not in agree mode: never crash the job
                log.error("cannot apply tuner config version %d: %s", v, e)
                return plugin.applied_version
        return v
    if plugin is not None:
        plugin.prepare_version(0)      # unpin
    log.warning("tuner config version %d is not available on every rank; keeping version %d", v, applied)
    return applied


def run_ranks(plugins: Sequence[_Control | None]) -> list[int]:
    """Run :func:`agree_with` for several ranks in one process (threads + an in-memory MIN all-reduce);
    the simulator and the tests use it. Returns each rank's applied version."""
    n = len(plugins)
    barrier = threading.Barrier(n)
    lock = threading.Lock()
    slots: list[list[int] | None] = [None] * n
    result: list[list[int]] = [[]]

    def make(rank: int) -> Callable[[Sequence[int]], Sequence[int]]:
        def all_reduce_min(vals: Sequence[int]) -> Sequence[int]:
            with lock:
                slots[rank] = list(vals)
            if barrier.wait() == 0:
                result[0] = [min(col) for col in zip(*slots)]
            barrier.wait()
            out = list(result[0])
            barrier.wait()
            return out
        return all_reduce_min

    out: list[int] = [0] * n
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            out[rank] = agree_with(make(rank), plugins[rank])
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


# ------------------------------------------------------------------------------------------------------------
# The plugin NCCL loaded in this process
# ------------------------------------------------------------------------------------------------------------
class PluginControl:
    """The DynamICCL control functions of a tuner library already loaded in this process (by NCCL)."""

    def __init__(self, lib) -> None:
        import ctypes

        u64 = ctypes.c_uint64
        self._lib = lib
        for name, res, args in (("dynamiccl_tuner_staged_version", u64, []),
                                ("dynamiccl_tuner_applied_version", u64, []),
                                ("dynamiccl_tuner_prepare_version", ctypes.c_int, [u64]),
                                ("dynamiccl_tuner_apply_version", ctypes.c_int, [u64]),
                                ("dynamiccl_tuner_last_error", ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self._buf = ctypes.create_string_buffer(512)

    @property
    def staged_version(self) -> int:
        return int(self._lib.dynamiccl_tuner_staged_version())

    @property
    def applied_version(self) -> int:
        return int(self._lib.dynamiccl_tuner_applied_version())

    def prepare_version(self, version: int) -> bool:
        return bool(self._lib.dynamiccl_tuner_prepare_version(int(version)))

    def apply_version(self, version: int) -> None:
        if self._lib.dynamiccl_tuner_apply_version(int(version)) != 0:
            self._lib.dynamiccl_tuner_last_error(self._buf, len(self._buf))
            raise AgreementError(self._buf.value.decode(errors="replace") or f"cannot apply version {version}")


_found: dict[str, PluginControl | None] = {}
_warned: set[str] = set()


def _candidates(value: str | None) -> list[str]:
    # NCCL's search (nccl-plugin-abi.md §2.6): unset -> libnccl-tuner.so; else the value, then libnccl-tuner-<v>.so
    if value is None or value == "":
        return ["libnccl-tuner.so"]
    if value.lower() == "none":
        return []
    out = [value]
    if "/" not in value and not (value.startswith("lib") and value.endswith(".so")):
        out.append(f"libnccl-tuner-{value}.so")
    return out


def find_plugin(env_value: str | None = None) -> PluginControl | None:
    """The DynamICCL tuner that NCCL loaded in this process (``$NCCL_TUNER_PLUGIN``, found with
    ``dlopen(RTLD_NOLOAD)``, so nothing is loaded here), or None when NCCL has not loaded it (yet) or it
    is not the DynamICCL plugin. Cached once found."""
    import ctypes

    value = os.environ.get("NCCL_TUNER_PLUGIN") if env_value is None else env_value
    key = value or ""
    if _found.get(key) is not None:
        return _found[key]
    mode = getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_NOW", 2)
    for name in _candidates(value):
        try:
            lib = ctypes.CDLL(name, mode=mode)
        except OSError:
            continue
        if not hasattr(lib, "dynamiccl_tuner_prepare_version"):
            if key not in _warned:
                _warned.add(key)
                log.warning("tuner plugin %s is loaded but is not the DynamICCL tuner; the hook does nothing", name)
            return None
        _found[key] = PluginControl(lib)
        return _found[key]
    return None


def agree(group=None, *, plugin: _Control | None = None) -> int:
    """The PyTorch hook: agree on the tuner config version over ``group`` (default: the world) with one
    ``all_reduce(MIN)`` of an int64 tensor (two when the version changes), then apply it. Call it on every
    rank at the same point of the step, after ``init_process_group``. ``plugin`` defaults to the DynamICCL
    tuner NCCL loaded in this process (:func:`find_plugin`); until NCCL has loaded it (before the first
    NCCL collective) the rank takes part with version 0. Returns the applied version."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise AgreementError("dynamiccl.nccl_tuner_plugin.sync.agree() needs torch.distributed.init_process_group() first")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")

    def all_reduce_min(vals: Sequence[int]) -> list[int]:
        t = torch.tensor(list(vals), dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
        return [int(x) for x in t.tolist()]

    return agree_with(all_reduce_min, plugin if plugin is not None else find_plugin())
