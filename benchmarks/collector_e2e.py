"""End to end: a sender process writes frames to the collector's Unix socket at a fixed rate.

Counts sent vs received vs decoded vs dropped; the run passes only if nothing was lost, the
parquet history included (every record written, ``parquet_dropped=0``), and the achieved rate is at
least 95 % of the target (the sender blocks rather than drop, so a collector that cannot keep up
shows as a lower achieved rate). The collector runs in
this process (Pipeline with the stream receiver, aggregation, the Prometheus state, the feature
stream and — unless --no-parquet — the parquet history, whose writer is a child process). CPU
per million records is printed for the sender, the collector process and the writer process.
Baseline, in the same process: the sender's raw socket throughput into a reader that discards.
Last line: machine-readable key=value.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402


RATE_FLOOR = 0.95  # achieved / target rate below this fails the run


def verdict(*, sent: int, received: int, dropped: int, lost: int, history_ok: bool, achieved: float,
            target: float) -> tuple[bool, bool]:
    """``(pass, rate_ok)``: nothing lost and the achieved rate at least ``RATE_FLOOR`` of the target.
    The sender blocks instead of dropping, so a collector that cannot keep up shows only as a lower
    achieved rate: without the rate check such a run would pass."""
    rate_ok = achieved >= RATE_FLOOR * target
    return received == sent and dropped == 0 and lost == 0 and history_ok and rate_ok, rate_ok


def sender(path: str, rate: float, duration: float, ranks: int, frame: int, seed: int, q,
           paced: bool = True) -> None:
    from dynamiccl.harness.collector_testing import advance, encode_frame, encode_frames, process_record, synthetic_events
    tick = 0.01
    per_tick = int(rate * tick)
    inst_per_tick = max(1, per_tick // ranks)
    template = synthetic_events(inst_per_tick, nranks=ranks, seed=seed, rate_per_s=inst_per_tick / tick,
                                start_ns=time.time_ns())
    socks = []
    for r in range(ranks):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.sendall(encode_frame(process_record("bench-node", "e2e", 5000 + r, start_ns=1)))
        socks.append(s)
    masks = [template["rank"] == r for r in range(ranks)]
    sent = 0
    t0 = time.monotonic()
    step = 0
    lag_max = 0.0
    while True:
        target = t0 + step * tick
        now = time.monotonic()
        if paced and target - t0 >= duration:
            break
        if not paced:
            if now - t0 >= duration:
                break
        elif now < target:
            time.sleep(target - now)
        else:
            lag_max = max(lag_max, now - target)
        ev = advance(template, step, period_ns=int(tick * 1e9), instances=inst_per_tick)
        for r, s in enumerate(socks):
            mine = ev[masks[r]]
            s.sendall(encode_frames(mine, per_frame=frame))
            sent += len(mine)
        step += 1
    elapsed = time.monotonic() - t0
    for s in socks:
        s.close()
    q.put({"sent": sent, "elapsed": elapsed, "sender_lag_max_s": lag_max, "connections": ranks,
           "cpu_s": time.process_time()})


def _proc_cpu(pid: int | None) -> float:
    """CPU seconds used so far by a live process (utime + stime from /proc); 0 if none."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def baseline(rate: float, duration: float, ranks: int, frame: int, seed: int) -> float:
    """Records/s the same sender achieves unpaced for ``duration`` s into a reader that discards."""
    d = tempfile.mkdtemp(prefix="dcb")
    path = os.path.join(d, "b.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen()
    got = [0]

    def reader():
        conns = []
        srv.settimeout(5)
        for _ in range(ranks):
            conns.append(srv.accept()[0])
        import selectors
        sel = selectors.DefaultSelector()
        for c in conns:
            sel.register(c, selectors.EVENT_READ)
        open_ = len(conns)
        while open_:
            for key, _ in sel.select(1):
                b = key.fileobj.recv(1 << 20)
                if not b:
                    sel.unregister(key.fileobj)
                    open_ -= 1
                got[0] += len(b)

    t = threading.Thread(target=reader)
    t.start()
    q = mp.Queue()
    p = mp.Process(target=sender, args=(path, rate, duration, ranks, frame, seed, q, False))
    p.start()
    res = q.get()
    p.join()
    t.join()
    shutil.rmtree(d, ignore_errors=True)
    return res["sent"] / res["elapsed"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=500_000, help="records/s")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds")
    ap.add_argument("--ranks", type=int, default=8, help="sender connections (one per rank)")
    ap.add_argument("--frame", type=int, default=512, help="records per frame")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-parquet", action="store_true")
    ap.add_argument("--compression", default=None, help="parquet compression (default: the collector's)")
    ap.add_argument("--writer", default=None, choices=("process", "thread"),
                    help="parquet writer (default: the collector's, a child process)")
    ap.add_argument("--baseline-s", type=float, default=2.0, help="seconds of the raw-socket baseline")
    args = ap.parse_args(argv)
    from dynamiccl.collector.config import default_config
    from dynamiccl.collector.pipeline import Pipeline

    base = baseline(args.rate, args.baseline_s, args.ranks, args.frame, args.seed)
    d = tempfile.mkdtemp(prefix="dce")
    path = os.path.join(d, "c.sock")
    cfg = default_config().replace(
        receiver={"listen": (f"unix:{path}",)}, prometheus={"address": None},
        features={"address": None},
        parquet={"directory": None if args.no_parquet else os.path.join(d, "pq"),
                 **({"compression": args.compression} if args.compression else {}),
                 **({"writer": args.writer} if args.writer else {})})
    pipe = Pipeline(cfg).start()
    writer_pid = pipe.parquet.writer_pid if pipe.parquet is not None else None
    cpu0 = time.process_time()
    sub = pipe.subscribe(max_queue=10_000)
    q = mp.Queue()
    p = mp.Process(target=sender, args=(path, args.rate, args.duration, args.ranks, args.frame, args.seed, q))
    t0 = time.monotonic()
    p.start()
    res = q.get()
    p.join()
    deadline = time.monotonic() + 60
    while pipe.metrics.received < res["sent"] + args.ranks and time.monotonic() < deadline:
        time.sleep(0.05)
    pipe.flush(30)
    writer_cpu = _proc_cpu(writer_pid)  # before shutdown reaps it (shutdown adds only the file footers)
    pipe.shutdown()
    wall = time.monotonic() - t0
    collector_cpu = time.process_time() - cpu0
    m = pipe.metrics.snapshot()
    parquet_rows = pipe.metrics.parquet_rows
    parquet_dropped = m["records_dropped_total"]["parquet_queue_full"] + m["records_dropped_total"]["parquet_write_failed"]
    windows = 0
    while sub.get(0) is not None:
        windows += 1
    shutil.rmtree(d, ignore_errors=True)
    received = m["records_received_total"] - args.ranks  # PROCESS records
    dropped = sum(m["records_dropped_total"].values())
    lost = res["sent"] - m["records_aggregated_total"]
    print(f"sent={res['sent']} in {res['elapsed']:.1f}s ({res['sent'] / res['elapsed']:.0f} rec/s, "
          f"sender max lag {res['sender_lag_max_s'] * 1000:.0f} ms) over {args.ranks} connections")
    print(f"received={received} decoded={m['records_decoded_total']} aggregated={m['records_aggregated_total']} "
          f"dropped={m['records_dropped_total']} malformed={sum(m['malformed_frames_total'].values())}")
    print(f"windows={m['windows_emitted_total']} delivered_to_subscriber={windows} "
          f"parquet={'off' if args.no_parquet else 'on'} wall={wall:.1f}s")
    print(f"baseline raw socket sender throughput: {base:.0f} rec/s; target rate / baseline = {args.rate / base:.3f}")
    per_m = res["sent"] / 1e6
    print(f"CPU-s per M records: sender {res['cpu_s'] / per_m:.3f}, collector process {collector_cpu / per_m:.3f}, "
          f"parquet writer process {writer_cpu / per_m:.3f} (writer pid {writer_pid}); "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    history_ok = args.no_parquet or (parquet_rows == res["sent"] and parquet_dropped == 0)
    achieved = res["sent"] / res["elapsed"]
    ok, rate_ok = verdict(sent=res["sent"], received=received, dropped=dropped, lost=lost, history_ok=history_ok,
                          achieved=achieved, target=args.rate)
    print(f"sent={res['sent']} received={received} dropped={dropped} lost={lost} "
          f"rate_rps={achieved:.0f} target_rps={args.rate:.0f} rate_ratio={achieved / args.rate:.3f} "
          f"rate_ok={int(rate_ok)} baseline_rps={base:.0f} "
          f"duration_s={res['elapsed']:.1f} parquet={int(not args.no_parquet)} "
          f"parquet_rows={parquet_rows} parquet_dropped={parquet_dropped} "
          f"sender_lag_max_s={res['sender_lag_max_s']:.2f} load1={os.getloadavg()[0]:.2f} pass={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
