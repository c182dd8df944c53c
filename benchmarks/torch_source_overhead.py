"""Per-call cost of the torch.distributed source vs the bare call, in the same process.

gloo, world size 1 (FileStore, no network), one CPU core (the source's sender thread shares it,
so its encoding work is part of the measured cost), a unix-socket sink in a child process
draining the stream. Blocks of ``--calls`` calls alternate bare / recorded ``--blocks`` times;
the overhead is the median over blocks of (recorded − bare) per call, in CPU time of the whole
process (``time.process_time``: the caller, gloo's threads and the sender thread — what the
source costs the machine, insensitive to other processes' load) and in wall-clock time (what
the caller waits; inflated and noisy when the machine is busy). Four pairs:

* ``sync``: ``dist.all_reduce(t)`` (1 float32) — the original function vs the wrapped one;
* ``async``: ``dist.all_reduce(t, async_op=True).wait()`` with the default ``wait`` timing (the
  record is completed in the patched ``Work.wait``); the bare side calls the original, unpatched
  ``Work.wait``;
* ``async-callback``: the same with ``async_timing="callback"`` (the future's done-callback,
  which takes the GIL on gloo's thread) — the previous design, for comparison;
* ``wrapper``: the wrapper around a no-op with all_reduce's signature vs the no-op itself — the
  source's own cost without gloo's run-to-run noise.

Last line: machine-readable key=value (ns per call).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

_SINK = r"""
import os, socket, sys
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX); srv.bind(path); srv.listen(4)
print("ready", flush=True)
c, _ = srv.accept()
n = 0
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
print(n, flush=True)
"""


def _block(fn, n: int) -> tuple[float, float]:
    """(CPU ns, wall ns) per call."""
    c0, t0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.process_time_ns() - c0) / n, (time.perf_counter_ns() - t0) / n


def _pair(bare, recorded, *, calls: int, blocks: int) -> dict:
    """Medians over blocks: bare / recorded / overhead per call, CPU and wall (ns)."""
    rows = []
    _block(bare, calls // 4)
    _block(recorded, calls // 4)  # warm-up (first call builds the communicator)
    for i in range(blocks):
        if i % 2:
            r = _block(recorded, calls)
            b = _block(bare, calls)
        else:
            b = _block(bare, calls)
            r = _block(recorded, calls)
        rows.append((b, r))
    med = statistics.median
    return {f"{what}_{clock}": med(f(b[k], r[k]) for b, r in rows)
            for k, clock in ((0, "cpu"), (1, "wall"))
            for what, f in (("bare", lambda b, r: b), ("rec", lambda b, r: r), ("over", lambda b, r: r - b))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per block")
    ap.add_argument("--blocks", type=int, default=21)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    import dynamiccl.collector.sources.torch_distributed as src
    from dynamiccl.collector.sources.torch_hooks import make_wrapper

    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="dynamiccl-bench-")
    sock = os.path.join(tmp, "sink.sock")
    sink = subprocess.Popen([sys.executable, "-c", _SINK, sock], stdout=subprocess.PIPE, text=True)
    assert sink.stdout.readline().strip() == "ready"
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    t = torch.ones(1)
    bare_all_reduce = dist.all_reduce

    def noop(tensor, op=None, group=None, async_op=False):
        return None

    bare_wait = dist.Work.wait  # the unpatched method (enable() patches the class)
    rec = src.enable(f"unix:{sock}", host="bench", job_id="bench", flush_ms=100)
    wrapped_noop = make_wrapper(noop, "all_reduce")
    wrapped_all_reduce = dist.all_reduce
    assert wrapped_all_reduce is not bare_all_reduce and dist.Work.wait is not bare_wait
    try:
        sync = _pair(lambda: bare_all_reduce(t), lambda: wrapped_all_reduce(t),
                     calls=args.calls, blocks=args.blocks)
        asyn = _pair(lambda: bare_wait(bare_all_reduce(t, async_op=True)),
                     lambda: wrapped_all_reduce(t, async_op=True).wait(),
                     calls=args.calls, blocks=args.blocks)
        wrap = _pair(lambda: noop(t), lambda: wrapped_noop(t), calls=args.calls * 10, blocks=args.blocks)
        time.sleep(0.3)
        st = rec.stats()
        assert st["async_pending"] == 0 and st["events_stale"] == 0, st
    finally:
        src.disable()
    # the previous design, for comparison: the future's done-callback (own sink connection)
    sink2 = subprocess.Popen([sys.executable, "-c", _SINK, sock + "2"], stdout=subprocess.PIPE, text=True)
    assert sink2.stdout.readline().strip() == "ready"
    rec2 = src.enable(f"unix:{sock}2", host="bench", job_id="bench", flush_ms=100, async_timing="callback")
    try:
        wrapped_all_reduce = dist.all_reduce
        cb = _pair(lambda: bare_wait(bare_all_reduce(t, async_op=True)),
                   lambda: wrapped_all_reduce(t, async_op=True).wait(),
                   calls=args.calls, blocks=args.blocks)
        time.sleep(0.3)
        st2 = rec2.stats()
    finally:
        src.disable()
        dist.destroy_process_group()
    sink2.wait(timeout=10)
    sink.wait(timeout=10)
    received = int(sink.stdout.read().strip() or 0)
    print(f"torch {torch.__version__}, gloo world 1, {args.blocks} blocks x {args.calls} calls, 1 core")
    print(f"{'':24s} {'CPU time per call (us)':^34s} | {'wall clock per call (us)':^34s}")
    print(f"{'':24s} {'bare':>10s} {'recorded':>10s} {'overhead':>10s}   | "
          f"{'bare':>10s} {'recorded':>10s} {'overhead':>10s}")
    for name, m in (("sync all_reduce", sync), ("async all_reduce+wait", asyn),
                    ("async, callback timing", cb), ("wrapper around a no-op", wrap)):
        print(f"{name:24s} " + "   | ".join(
            f"{m['bare_' + c] / 1e3:10.2f} {m['rec_' + c] / 1e3:10.2f} {m['over_' + c] / 1e3:10.2f}"
            for c in ("cpu", "wall")))
    print(f"records emitted {st['records_emitted']}, sent {st['records_sent']}, "
          f"dropped {st['records_dropped_ring_full']}, undelivered {st['records_undelivered']}, "
          f"bytes at the sink {received}; callback run: emitted {st2['records_emitted']}, "
          f"dropped {st2['records_dropped_ring_full']}")
    print(f"overhead_sync_ns={sync['over_cpu']:.0f} overhead_async_ns={asyn['over_cpu']:.0f} "
          f"overhead_async_callback_ns={cb['over_cpu']:.0f} wrapper_only_ns={wrap['over_cpu']:.0f} "
          f"wall_overhead_sync_ns={sync['over_wall']:.0f} wall_overhead_async_ns={asyn['over_wall']:.0f} "
          f"wall_overhead_async_callback_ns={cb['over_wall']:.0f} "
          f"ratio_sync={sync['rec_cpu'] / sync['bare_cpu']:.3f} "
          f"ratio_async={asyn['rec_cpu'] / asyn['bare_cpu']:.3f} target_ns=5000 (CPU time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
