"""Per-call cost of the torch.distributed source vs the bare call, in the same process.

gloo, world size 1 (FileStore, no network), one CPU core (the source's sender thread shares it,
so its encoding work is part of the measured cost), a unix-socket sink in a child process
draining the stream. Blocks of ``--calls`` calls alternate bare / recorded ``--blocks`` times;
the overhead is the median over blocks of (recorded − bare) per call. Three pairs:

* ``sync``: ``dist.all_reduce(t)`` (1 float32) — the original function vs the wrapped one;
* ``async``: ``dist.all_reduce(t, async_op=True).wait()`` (adds the future done-callback);
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


def _block(fn, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def _pair(bare, recorded, *, calls: int, blocks: int) -> tuple[float, float, float]:
    diffs, b_all, r_all = [], [], []
    _block(bare, calls // 4)
    _block(recorded, calls // 4)  # warm-up (first call builds the communicator)
    for i in range(blocks):
        if i % 2:
            r = _block(recorded, calls)
            b = _block(bare, calls)
        else:
            b = _block(bare, calls)
            r = _block(recorded, calls)
        diffs.append(r - b)
        b_all.append(b)
        r_all.append(r)
    return statistics.median(b_all), statistics.median(r_all), statistics.median(diffs)


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

    import collector.sources.torch_distributed as src

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

    rec = src.enable(f"unix:{sock}", host="bench", job_id="bench", flush_ms=100)
    wrapped_noop = src._make_wrapper(noop, "all_reduce")
    wrapped_all_reduce = dist.all_reduce
    assert wrapped_all_reduce is not bare_all_reduce
    try:
        sync = _pair(lambda: bare_all_reduce(t), lambda: wrapped_all_reduce(t),
                     calls=args.calls, blocks=args.blocks)
        asyn = _pair(lambda: bare_all_reduce(t, async_op=True).wait(),
                     lambda: wrapped_all_reduce(t, async_op=True).wait(),
                     calls=args.calls, blocks=args.blocks)
        wrap = _pair(lambda: noop(t), lambda: wrapped_noop(t), calls=args.calls * 10, blocks=args.blocks)
        time.sleep(0.3)
        st = rec.stats()
    finally:
        src.disable()
        dist.destroy_process_group()
    sink.wait(timeout=10)
    received = int(sink.stdout.read().strip() or 0)
    print(f"torch {torch.__version__}, gloo world 1, {args.blocks} blocks x {args.calls} calls, 1 core")
    for name, (b, r, d) in (("sync all_reduce", sync), ("async all_reduce+wait", asyn),
                            ("wrapper around a no-op", wrap)):
        print(f"{name:24s} bare {b / 1e3:8.2f} us   recorded {r / 1e3:8.2f} us   "
              f"overhead {d / 1e3:6.2f} us  ({d / b * 100 if b else 0:5.1f} % of bare)")
    print(f"records emitted {st['records_emitted']}, sent {st['records_sent']}, "
          f"dropped {st['records_dropped_ring_full']}, undelivered {st['records_undelivered']}, "
          f"bytes at the sink {received}")
    print(f"overhead_sync_ns={sync[2]:.0f} overhead_async_ns={asyn[2]:.0f} "
          f"wrapper_only_ns={wrap[2]:.0f} bare_sync_ns={sync[0]:.0f} "
          f"ratio_sync={sync[1] / sync[0]:.3f} target_ns=5000")
    return 0


if __name__ == "__main__":
    sys.exit(main())
