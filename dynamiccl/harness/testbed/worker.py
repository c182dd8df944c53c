"""One test-bed rank: a gloo data-parallel training-like loop, instrumented by the torch source.

Run inside the rank's network namespace by :mod:`dynamiccl.harness.testbed.run` (``ip netns exec NS python -m
dynamiccl.harness.testbed.worker ...``). Each step is a data-parallel step the way DDP runs it:

1. load the batch: ``--batch-bytes`` from the data server (``--data``, :mod:`dynamiccl.harness.testbed.traffic`)
   over the rank's own link;
2. ``--compute-ms`` of "forward/backward" (a sleep: the test bed leaves the CPU to the network);
3. one ``all_reduce(async_op=True)`` per gradient bucket (``--buckets``, several sizes), launched
   back to back as backward would produce them, then wait for all of them.

A rank whose link is slow loads its batch late and launches its buckets late; its peers' bucket
all-reduces wait for it, so its own durations are the shortest of each instance — the straggler
signature the detector localises. Rank 0 puts the stop flag in the last element of the last
bucket (the others put 0), so every rank leaves the loop after the same step. The
torch.distributed source streams every call to ``--collector`` (``DYNAMICCL_HOST`` =
``rank<r>``).

The loop ends at ``--until`` (epoch seconds, decided by rank 0) or on SIGTERM (rank 0 then stops
the others through the flag); a peer that vanished ends it too. Exit status 0 on an orderly stop.
"""
from __future__ import annotations

import argparse
import datetime
import os
import resource
import signal
import socket
import sys
import time

__all__ = ["main", "parse_buckets"]


def parse_buckets(text: str) -> list[int]:
    """``"64k,256k,1m"`` → bytes per bucket.

    >>> parse_buckets("64k,256k,1m,4096")
    [65536, 262144, 1048576, 4096]
    """
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        mult = {"k": 1 << 10, "m": 1 << 20}.get(part[-1:], 1)
        num = part[:-1] if mult > 1 else part
        if not num.isdigit() or int(num) <= 0:
            raise ValueError(f"bucket size {part!r}: expected a positive size like 64k or 1m")
        out.append(int(num) * mult)
    return out


def _mlockall() -> None:
    """mlockall(MCL_CURRENT | MCL_FUTURE); a warning (not an error) when refused."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mlockall(1 | 2) != 0:
        print(f"mlockall failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="HOST:PORT of rank 0's TCP store")
    ap.add_argument("--ifname", default="eth0")
    ap.add_argument("--collector", required=True)
    ap.add_argument("--job-id", default="testbed")
    ap.add_argument("--buckets", default="64k,256k,1m")
    ap.add_argument("--compute-ms", type=float, default=10.0)
    ap.add_argument("--data", default="", help="IP:PORT of the data server; empty = no batch loading")
    ap.add_argument("--batch-bytes", type=int, default=0)
    ap.add_argument("--until", type=float, default=0.0, help="epoch seconds; 0 = until SIGTERM")
    ap.add_argument("--flush-ms", type=int, default=50)
    ap.add_argument("--mlock", action="store_true",
                    help="lock the process's memory (no page-fault stalls when the host reclaims memory)")
    return ap


def _catch_stop() -> dict:
    """SIGTERM/SIGINT set the returned ``{"flag": ...}``: rank 0 then stops every rank through the
    step's flag (a signal never interrupts a collective half-way)."""
    stop = {"flag": False}

    def _term(_sig, _frm):
        stop["flag"] = True

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    return stop


def _connect_data(args):
    """The data server's connection and its `fetch`, or (None, None) without batch loading."""
    if not (args.data and args.batch_bytes > 0):
        return None, None
    from dynamiccl.harness.testbed.traffic import fetch
    host, port = args.data.rsplit(":", 1)
    data = socket.create_connection((host, int(port)), timeout=30)
    data.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return data, fetch


def _train(args, dist, grads: list, stop: dict) -> tuple[int, int]:
    """The step loop (module docstring: load, compute, one async all-reduce per bucket) →
    (steps, exit status). Rank 0's stop flag rides in the last bucket's last element, so every
    rank leaves after the same step; a peer that vanished ends the loop with status 1."""
    data, fetch = _connect_data(args)
    batch = bytearray(max(args.batch_bytes, 1))
    steps = 0
    try:
        while True:
            if data is not None:
                fetch(data, args.batch_bytes, batch)
            time.sleep(args.compute_ms / 1000.0)
            stopping = args.rank == 0 and (stop["flag"] or bool(args.until and time.time() >= args.until))
            grads[-1][-1] = 1.0 if stopping else 0.0
            works = [dist.all_reduce(g, async_op=True) for g in grads]
            for w in works:
                w.wait()
            steps += 1
            if grads[-1][-1] > 0:
                break
    except Exception as exc:  # a peer went away: leave quietly
        print(f"rank {args.rank}: stopped after {steps} steps: {exc}", file=sys.stderr)
        return steps, 1
    return steps, 0


def _print_stats(rank: int, steps: int, st: dict) -> None:
    """The rank's last line (read by the test-bed run): steps, the source's delivery counters, and
    the memory/scheduling stalls a shared machine caused."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"rank {rank}: steps={steps} records_sent={st.get('records_sent')} "
          f"dropped={st.get('records_dropped_ring_full')} undelivered={st.get('records_undelivered')} "
          f"major_faults={ru.ru_majflt} involuntary_switches={ru.ru_nivcsw}",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    buckets = parse_buckets(args.buckets)

    os.environ.setdefault("GLOO_SOCKET_IFNAME", args.ifname)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    stop = _catch_stop()

    import torch
    import torch.distributed as dist

    import dynamiccl.collector.sources.torch_distributed as source

    torch.set_num_threads(1)
    if args.mlock:
        _mlockall()
    source.enable(args.collector, host=f"rank{args.rank}", job_id=args.job_id, flush_ms=args.flush_ms)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=60))
    grads = [torch.ones(n // 4, dtype=torch.float32) for n in buckets]
    steps, status = _train(args, dist, grads, stop)
    _print_stats(args.rank, steps, source.stats())
    source.disable()
    if status == 0:
        try:
            dist.destroy_process_group()
        except Exception:  # pragma: no cover
            pass
    return status


if __name__ == "__main__":
    sys.exit(main())
