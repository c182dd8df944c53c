"""One rank of ``dynamiccl validate-nccl``: runs the phases its spec names on the NCCL backend.

Started by :mod:`dynamiccl.validate.launch` as ``python -m dynamiccl.validate.worker`` with
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and ``DCCL_VALIDATE_SPEC`` (a JSON file)
in its environment. Imports only the standard library, numpy (through the tuner config module) and
torch. Every call it issues is logged with its wall-clock enqueue time and its CUDA-event duration,
so the parent can match it to the profiler's records; the result goes to ``<out>/rank<R>.<launch>.json``.
"""
from __future__ import annotations

import json
import os
import sys
import time

from dynamiccl.contracts.atomic import atomic_write

# torch functions by the name the profiler records them under
# AlltoAll has its own phase, last: NCCL 2.28's kernels count a send/recv-to-self work item in the
# per-channel profiler counter while the host does not, so every later KernelCh event on those
# channels carries another kernel's timestamps (docs/real-nccl.md). Phase "after_a2a" shows it.
SWEEP_FUNCS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "SendRecv")
TUNED_BYTES = 1 << 20   # the AllReduce size the tuner phases force


class _WallEvent:
    """A CUDA event's interface on the host clock (gloo smoke runs only)."""

    def __init__(self, enable_timing: bool = True):
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "_WallEvent") -> float:
        return (end.t - self.t) * 1e3


class Rank:
    def __init__(self, spec: dict):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.spec = torch, dist, spec
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        if spec.get("backend", "nccl") == "nccl":
            self.device = torch.device("cuda", spec["devices"][self.rank])
            torch.cuda.set_device(self.device)
            dist.init_process_group("nccl", rank=self.rank, world_size=self.world, device_id=self.device)
            self.event, self.sync = torch.cuda.Event, torch.cuda.synchronize
        else:   # the CPU smoke test of the phases (gloo): wall-clock "events"
            self.device = torch.device("cpu")
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world)
            self.event, self.sync = _WallEvent, (lambda: None)
        self.calls: list[list] = []
        self.marks: dict[str, int] = {}

    # --- one timed call -------------------------------------------------------------------------
    def timed(self, phase: str, func: str, nbytes: int, enqueue) -> float:
        """Run ``enqueue()`` (returns a work handle or a list of them), wait for it, and log it."""
        start, end = self.event(enable_timing=True), self.event(enable_timing=True)
        t_ns = time.time_ns()
        start.record()
        works = enqueue()
        for w in works if isinstance(works, list) else [works]:
            if w is not None:
                w.wait()
        if isinstance(works, list):    # batched P2P: wait() does not order the current stream after it
            self.sync()
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1e3
        self.calls.append([phase, func, int(nbytes), t_ns, round(us, 3), self._nccl_us(works)])
        return us

    @staticmethod
    def _nccl_us(works) -> float | None:
        # CUDA events torch records on NCCL's own stream around the call (TORCH_NCCL_ENABLE_TIMING=1)
        if isinstance(works, list) or works is None:
            return None
        for name in ("_get_duration", "get_duration"):
            fn = getattr(works, name, None)
            if fn is not None:
                try:
                    return round(float(fn()) * 1e3, 3)
                except Exception:   # noqa: BLE001 - timing not enabled: fall back to our events
                    return None
        return None

    # --- the collectives ------------------------------------------------------------------------
    def enqueue(self, func: str, nbytes: int):
        """A closure issuing ``func`` on a float32 buffer of about ``nbytes`` per rank, and the bytes."""
        torch, dist, n = self.torch, self.dist, self.world
        count = max(nbytes // 4, 1)
        if func == "AlltoAll":
            count = max(n, (count // n) * n)
        buf = torch.ones(count, dtype=torch.float32, device=self.device)
        nb = count * 4
        if func == "AllReduce":
            return (lambda: dist.all_reduce(buf, async_op=True)), nb
        if func == "AllGather":
            out = torch.empty(count * n, dtype=torch.float32, device=self.device)
            return (lambda: dist.all_gather_into_tensor(out, buf, async_op=True)), nb
        if func == "ReduceScatter":
            big = torch.ones(count * n, dtype=torch.float32, device=self.device)
            return (lambda: dist.reduce_scatter_tensor(buf, big, async_op=True)), nb
        if func == "Broadcast":
            return (lambda: dist.broadcast(buf, src=0, async_op=True)), nb
        if func == "AlltoAll":
            out = torch.empty_like(buf)
            return (lambda: dist.all_to_all_single(out, buf, async_op=True)), nb
        if func == "SendRecv":
            recv = torch.empty_like(buf)
            nxt, prv = (self.rank + 1) % n, (self.rank - 1) % n
            ops = [dist.P2POp(dist.isend, buf, nxt), dist.P2POp(dist.irecv, recv, prv)]
            return (lambda: dist.batch_isend_irecv(ops)), nb
        raise ValueError(f"unknown collective {func!r}")

    # --- phases ---------------------------------------------------------------------------------
    def phase_sweep(self, funcs=SWEEP_FUNCS, name: str = "sweep") -> None:
        for func in funcs:
            for size in self.spec["sizes"]:
                call, nb = self.enqueue(func, size)
                reps = 1 + (self.spec["reps"] if size < (64 << 20) else max(1, self.spec["reps"] - 1))
                for i in range(reps):
                    self.timed(name if i else "warmup", func, nb, call)
                del call
            if self.device.type == "cuda":
                self.torch.cuda.empty_cache()

    def _stage(self, versions: list[dict]) -> None:
        """Rank 0 writes the tuner config (every version so far, as the retuner does)."""
        if self.rank == 0:
            from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, write_configs
            cfgs = [TunerConfig(v["version"], tuple(Rule(**r) for r in v["rules"])) for v in versions]
            write_configs(os.environ["DYNAMICCL_TUNER_CONFIG"], cfgs)

    def _agree(self) -> int:
        from dynamiccl.nccl_tuner_plugin.sync import agree
        return int(agree())

    def phase_tuner(self) -> None:
        """Each forced version: staged by rank 0, seen by every plugin (poll), agreed, then used."""
        versions = self.spec["tuner_versions"]
        for i, v in enumerate(versions):
            self._stage(versions[:i + 1])
            time.sleep(0.5)                       # > the plugin's 100 ms poll on every rank
            applied = self._agree()
            self.marks[f"tuner_v{v['version']}_applied"] = applied
            for func, size in (("AllReduce", TUNED_BYTES), ("AllGather", TUNED_BYTES)):
                call, nb = self.enqueue(func, size)
                for _ in range(5):
                    self.timed(f"tuner_v{v['version']}", func, nb, call)

    def phase_reload(self) -> None:
        """A version written mid-run, staged at different times on each rank, switched by agree()."""
        spec = self.spec["reload"]
        call, nb = self.enqueue("AllReduce", TUNED_BYTES)
        for step in range(spec["steps"]):
            applied = self._agree()
            if step == spec["write_at_step"]:
                self._stage(self.spec["tuner_versions"] + [spec["version"]])
            for _ in range(4):
                self.timed(f"reload_step{step}_v{applied}", "AllReduce", nb, call)
            time.sleep(0.02)

    def phase_slow(self) -> None:
        """A steady AllReduce stream, then one rank delays every call (a straggler)."""
        spec = self.spec["slow"]
        torch, dist = self.torch, self.dist
        call, nb = self.enqueue("AllReduce", spec["bytes"])
        t0 = time.perf_counter()
        for _ in range(50):
            self.timed("slow_calibrate", "AllReduce", nb, call)
        per = torch.tensor([(time.perf_counter() - t0) / 50], device=self.device)
        dist.all_reduce(per, op=dist.ReduceOp.MAX)       # one iteration count and delay on every rank
        call_s = float(per.item())
        delay_s = max(spec["delay_s"], spec["delay_ratio"] * call_s)   # peers wait >= (1 + ratio) x as long
        n_base = int(spec["base_s"] / (call_s + spec["gap_s"]))
        n_slow = int(spec["slow_s"] / (call_s + spec["gap_s"] + delay_s))
        self.marks["slow_delay_s"] = delay_s
        self.marks["slow_onset_ns"] = 0
        for i in range(n_base + n_slow):
            slow = i >= n_base
            if slow and not self.marks["slow_onset_ns"]:
                self.marks["slow_onset_ns"] = time.time_ns()
            if slow and self.rank == spec["slow_rank"]:
                time.sleep(delay_s)
            self.timed("slow_after" if slow else "slow_before", "AllReduce", nb, call)
            time.sleep(spec["gap_s"])

    def phase_alltoall(self) -> None:
        """The AlltoAll sweep, then AllReduce calls whose KernelCh timing shows whether NCCL's
        profiler counters still match the kernels after a send/recv to self."""
        self.phase_sweep(("AlltoAll",), "a2a")
        call, nb = self.enqueue("AllReduce", self.spec["slow"]["bytes"])
        for _ in range(10):
            self.timed("after_a2a", "AllReduce", nb, call)

    def phase_probe(self) -> None:
        """The extras' short programme (validate/extras.py): AllReduce calls of a few sizes, each
        timed and logged, the same on every launch so their records and event counts compare."""
        for size, calls in self.spec["probe"]["sizes"]:
            call, nb = self.enqueue("AllReduce", size)
            for _ in range(calls):
                self.timed("probe", "AllReduce", nb, call)

    def phase_overhead(self) -> None:
        """Per round of back-to-back AllReduce calls: the mean time per collective (wall clock, GPU
        synchronised at both ends) and the mean time the application thread spends enqueuing one
        (where the profiler's Coll start/stop run; the KernelCh events run on NCCL's proxy thread)."""
        out, enq = {}, {}
        for size, iters in self.spec["overhead"]["sizes"]:
            call, _nb = self.enqueue("AllReduce", size)
            for _ in range(3):
                call().wait()
            rounds, enqueue = [], []
            for _ in range(self.spec["overhead"]["rounds"]):
                self.sync()
                t0 = time.perf_counter()
                inside = 0.0
                for _ in range(iters):
                    t1 = time.perf_counter()
                    call()
                    inside += time.perf_counter() - t1
                self.sync()
                rounds.append((time.perf_counter() - t0) / iters * 1e6)
                enqueue.append(inside / iters * 1e6)
            out[str(size)], enq[str(size)] = rounds, enqueue
        self.marks["enqueue_us"] = enq
        self.marks["overhead_us"] = out

    def run(self) -> dict:
        self.marks["init_ok_ns"] = time.time_ns()
        for phase in self.spec["phases"]:
            self.marks[f"{phase}_start_ns"] = time.time_ns()
            getattr(self, f"phase_{phase}")()
            self.marks[f"{phase}_end_ns"] = time.time_ns()
        self.dist.destroy_process_group()
        return {"rank": self.rank, "pid": os.getpid(), "world": self.world, "calls": self.calls,
                "marks": self.marks, "cols": ["phase", "func", "bytes", "t_ns", "cuda_us", "nccl_us"]}


def main() -> int:
    with open(os.environ["DCCL_VALIDATE_SPEC"]) as f:
        spec = json.load(f)
    rank = int(os.environ["RANK"])
    marker = os.path.join(spec["out"], f"rank{rank}.{spec['launch']}.json")
    result = Rank(spec).run()
    atomic_write(marker, json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
