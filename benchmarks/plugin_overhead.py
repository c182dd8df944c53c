"""Per-collective overhead of the DynamICCL profiler plugin under NCCL's call sequence.

Replays eager AllReduce (float32, 8 channels, KernelCh on: 31 plugin calls per collective:
GroupApi start/record/stop, CollApi start/stop, Coll start/stop, 8 x KernelCh
start/record(KernelChStop)/stop) through the GPU-free emulator
(dynamiccl/nccl_profiler_plugin/emulator), once against a no-op plugin (returns success and a dummy
handle, same activation mask) and once against ours, with 1 thread (KernelCh inline) and with an
application thread + a proxy thread. Fixed workload: 20,000 warm-up + 200,000 timed collectives
per run. Interleaved: each of --reps rounds runs every configuration once, its baseline then its
candidate, so machine drift lands on all configurations alike; the minimum over the rounds of each side (the
median is printed beside it): on a shared machine a run is only ever slowed by other work, so the
minimum of interleaved runs is the cost without that interference, while the median moves with the
load (Session 14: the no-op's own median ranged 107 to 13,056 ns at load 7).

Records are really produced and delivered: a sink in this process listens on the collector
socket and counts the records it receives; the plugin's own counters (STATS) are printed too.
The ring is sized (DYNAMICCL_RING_SIZE=262144) to hold one run, because a run produces
~1M records/s, 100x what a training job does; with the default 65,536 records the excess would
be dropped and counted, which is cheaper than recording and would flatter the number.

Goals: issue 23's <= 100 ns added with one thread and <= 150 ns with v7 KernelPhase; the 2-thread
configuration keeps the earlier 300 ns bound (the issue states none).

A third configuration replays the same collectives through profiler ABI v7 with KernelPhase on
(mask 70|32768): three phase children per KernelCh, the initial_sync one kept (issue 23 goal: at
most 150 ns added, 1 thread); its no-op baseline runs v7 with the same mask.

A fourth configuration measures DYNAMICCL_PROFILER_CHAIN: ours with the no-op plugin chained behind it
against ours alone (1 thread, v6), so the figure is what chaining adds on top of our own cost, the
chained no-op's own calls included (issue 23 goal: at most 30 ns).

A sixth configuration is the first one with the record clock forced to clock_gettime (DYNAMICCL_CLOCK=0;
clock.h): reported, outside `pass` (the goals are for the defaults, and the default clock is the TSC where
it qualifies: x86-64 with constant_tsc, nonstop_tsc and the tsc clocksource).

A fifth configuration states the cost of per-peer network timing (ProxyOp|ProxyStep in the mask,
the emulator's EMU_F_NET: per channel a send and a receive proxy op, 2 steps each, 3 states per
step, so 2 PEER records per collective); its no-op baseline gets the same proxy events. No goal.

Instruction counts (valgrind --tool=callgrind, skipped with --no-callgrind or without valgrind):
wall-clock medians on a loaded machine swing by 2x, instruction counts do not. Each plugin runs
the emulator for INSTR_SHORT and INSTR_LONG collectives (1 thread); the difference divided by
the extra collectives is the per-collective count, start-up costs cancelled. They are reported
beside the nanoseconds; `pass` is the nanosecond goals (the issue's), never the counts.

--breakdown (needs valgrind) prints, for the no-op, ours, and ours with the no-op chained, the inclusive
callgrind count of each entry point (startEvent, stopEvent, recordEventState, the sender thread) per
collective at 1 and 8 channels, split into a per-channel part (KernelCh start, stop, KernelChStop state)
and a per-collective part, then exits.

Usage:  python benchmarks/plugin_overhead.py [--reps 15] [--colls 200000] [--no-callgrind] [--breakdown]
Last line (machine-readable):  profiler_added_ns_1thread=... profiler_added_ns_2threads=...
profiler_added_ns_v7_phases=... chain_added_ns=... profiler_added_instr_1thread=...
profiler_added_instr_v7_phases=... chain_added_instr=... net_added_ns=... net_added_instr=... vdso_added_ns=...
vdso_added_instr=... load1=...
pass=0|1 (every nanosecond goal met and every record delivered)
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dynamiccl.collector.decode import split_frames  # noqa: E402
PLUGIN_DIR = REPO / "dynamiccl" / "nccl_profiler_plugin"
BUILD = PLUGIN_DIR / "test" / "build"
GOAL_NS = {1: 100.0, 2: 300.0, "v7": 150.0, "chain": 30.0,  # issue 23; 2 threads: no stated goal, the earlier bound
           "net": None,  # per-peer timing: the issue asks for its cost to be stated, with no goal
           "vdso": None}  # the record clock forced to clock_gettime: reported beside the default's, no goal
NET_MASK, EMU_F_NET = 70 | 8 | 16, 0x2000
RECORDS_PER_COLL = {"net": 3}  # per-peer timing: the operation's record + a PEER record per direction
PHASES_MASK = 70 | 32768
EMU_F_PHASES = 0x400
WARMUP = 20_000
INSTR_SHORT, INSTR_LONG = 5_000, 15_000  # callgrind runs: the difference is per-collective work


class Sink:
    """Counts COLL/P2P records arriving on a Unix socket (frames split by the collector's parser)."""

    def __init__(self, path: str):
        self.records = 0
        self._lock = threading.Lock()
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(path)
        self._srv.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn):
        buf = bytearray()
        while True:
            chunk = conn.recv(1 << 22)
            if not chunk:
                return
            buf += chunk
            rows, used = split_frames(buf)
            if rows is not None:
                with self._lock:
                    self.records += int(np.isin(rows["kind"], (1, 2)).sum())  # COLL / P2P
            del buf[:used]

    def count(self) -> int:
        with self._lock:
            return self.records


def run_once(plugin: Path, threads: int, colls: int, env: dict, abi: int = 6, flags: int = 0) -> tuple[float, dict]:
    out = subprocess.run([str(BUILD / "emulate"), str(plugin), "--abi", str(abi), "--colls", str(colls),
                          "--warmup", str(WARMUP), "--threads", str(threads), "--reps", "1", "--flags", str(flags)],
                         capture_output=True, text=True, check=True, env=env).stdout
    ns = float(re.search(r"ns_per_coll_median=([\d.]+)", out).group(1))
    stats = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", out.split("stats:", 1)[1])} if "stats:" in out else {}
    return ns, stats


def instructions(plugin: Path, colls: int, env: dict, abi: int, flags: int) -> int:
    """Instructions callgrind counts for one emulator run of `colls` collectives (1 thread)."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", str(BUILD / "emulate"), str(plugin),
           "--abi", str(abi), "--colls", str(colls), "--warmup", "0", "--threads", "1", "--reps", "1",
           "--flags", str(flags)]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stderr
    return int(re.search(r"Collected : (\d+)", err).group(1))


def instr_per_coll(plugin: Path, env: dict, abi: int, flags: int) -> float:
    extra = INSTR_LONG - INSTR_SHORT
    return (instructions(plugin, INSTR_LONG, env, abi, flags) - instructions(plugin, INSTR_SHORT, env, abi, flags)) / extra


ENTRY_POINTS = {"libnccl-profiler-dynamiccl.so": ("dccl_start_v6", "dccl_stop_core", "dccl_record_state_core",
                                                 "sender_main"),
                "libnccl-profiler-noop.so": ("start_v6", "stop", "record")}


def entry_counts(plugin: Path, colls: int, channels: int, env: dict, out: str) -> dict:
    """Inclusive instructions of each of the plugin's entry points in one callgrind run (1 thread, v6)."""
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", str(BUILD / "emulate"), str(plugin),
                    "--abi", "6", "--colls", str(colls), "--warmup", "0", "--threads", "1", "--reps", "1",
                    "--channels", str(channels)], capture_output=True, text=True, check=True, env=env)
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", out],
                          capture_output=True, text=True, check=True).stdout
    names, counts = ENTRY_POINTS[plugin.name], {}
    for m in re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+(\S[^\n]*)$", text, re.M):
        name = m.group(2).split(" [")[0].split(":")[-1].strip()
        if name in names:
            counts[name] = max(counts.get(name, 0), int(m.group(1).replace(",", "")))
    return counts


def breakdown(runs: list[tuple[str, Path, dict]]) -> None:
    """Per-collective inclusive instructions of each entry point: per channel and per collective parts."""
    extra = INSTR_LONG - INSTR_SHORT
    with tempfile.TemporaryDirectory(prefix="dccl-cg-") as tmp:
        for label, plugin, env in runs:
            per = {}
            for ch in (1, 8):
                a, b = (entry_counts(plugin, n, ch, env, f"{tmp}/cg.{n}.{ch}") for n in (INSTR_SHORT, INSTR_LONG))
                per[ch] = {k: (b.get(k, 0) - a.get(k, 0)) / extra for k in ENTRY_POINTS[plugin.name]}
            for k in ENTRY_POINTS[plugin.name]:
                chan = (per[8][k] - per[1][k]) / 7
                print(f"{label:>30} {k:>24}: per collective at 8 channels {per[8][k]:7.1f}  "
                      f"= per channel {chan:6.1f} x 8 + per collective {per[1][k] - chan:6.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)  # minima: enough rounds to outlast a burst of load
    ap.add_argument("--colls", type=int, default=200_000)
    ap.add_argument("--no-callgrind", action="store_true", help="skip the instruction counts")
    ap.add_argument("--breakdown", action="store_true", help="instructions per entry point (callgrind), then exit")
    args = ap.parse_args()
    if args.reps < 5:
        ap.error("--reps must be >= 5")
    subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR), "libnccl-profiler-dynamiccl.so", "emulator"], check=True)
    ours, noop = PLUGIN_DIR / "libnccl-profiler-dynamiccl.so", BUILD / "libnccl-profiler-noop.so"

    tmp = tempfile.mkdtemp(prefix="dccl-bench-")
    sock = os.path.join(tmp, "collector.sock")
    sink = Sink(sock)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNAMICCL_")}
    env.update(DYNAMICCL_COLLECTOR=f"unix:{sock}", DYNAMICCL_RING_SIZE="262144")

    if args.breakdown:  # ours chained: the entry points' counts include the forwarding and the no-op's calls
        breakdown([(noop.name, noop, env), (ours.name, ours, env),
                   ("dynamiccl + chained no-op", ours, dict(env, DYNAMICCL_PROFILER_CHAIN=str(noop)))])
        return 0
    added = {}
    delivered = True
    print(f"eager AllReduce, 8 channels, KernelCh on; {WARMUP} warm-up + {args.colls} timed collectives per run, "
          f"{args.reps} rounds, each running every configuration (minimum; median beside it); load {os.getloadavg()}")
    phases_env = dict(env, DYNAMICCL_EVENT_MASK=str(PHASES_MASK))
    chain_env = dict(env, DYNAMICCL_PROFILER_CHAIN=str(noop))
    net_env = dict(env, DYNAMICCL_EVENT_MASK=str(NET_MASK))
    vdso_env = dict(env, DYNAMICCL_CLOCK="0")
    # (key, label, abi, flags, baseline plugin and env, measured plugin and env)
    configs = [(1, "1 thread", 6, 0, (noop, env), (ours, env)),
               (2, "2 threads (app + proxy)", 6, 0, (noop, env), (ours, env)),
               ("v7", "v7 + KernelPhase, 1 thread", 7, EMU_F_PHASES, (noop, phases_env), (ours, phases_env)),
               ("chain", "chained no-op, 1 thread", 6, 0, (ours, env), (ours, chain_env)),
               ("net", "per-peer timing, 1 thread", 6, EMU_F_NET, (noop, net_env), (ours, net_env)),
               ("vdso", "clock_gettime clock, 1 thread", 6, 0, (noop, env), (ours, vdso_env))]
    # Rounds outside, configurations inside: a burst of load costs every configuration one round, never
    # all the runs of one configuration (Session 16: a load-7 burst lost the 1-thread and v7 figures so).
    t_base: dict[object, list[float]] = {c[0]: [] for c in configs}
    t_cand: dict[object, list[float]] = {c[0]: [] for c in configs}
    last: dict = {}
    for _ in range(args.reps):
        for key, label, abi, flags, (base, benv), (cand, cenv) in configs:
            threads = 2 if key == 2 else 1
            t_base[key].append(run_once(base, threads, args.colls, benv, abi, flags)[0])
            before = sink.count()
            ns, st = run_once(cand, threads, args.colls, cenv, abi, flags)
            t_cand[key].append(ns)
            expected = (WARMUP + args.colls) * RECORDS_PER_COLL.get(key, 1)
            if st.get("records_emitted") != expected or st.get("records_sent") != expected:
                delivered = False
                print(f"  warning: {label}: plugin emitted {st.get('records_emitted')} / sent "
                      f"{st.get('records_sent')} of {expected} records: {st}", file=sys.stderr)
            last[key] = (st, sink.count() - before)
    for key, label, abi, flags, (base, benv), (cand, cenv) in configs:
        tb, tc = t_base[key], t_cand[key]
        st, received = last[key]
        m_base, m_cand = min(tb), min(tc)
        added[key] = m_cand - m_base
        med_added = statistics.median(tc) - statistics.median(tb)
        print(f"{label:>28}: {base.name} {m_base:7.1f} ns/coll   measured {m_cand:7.1f} ns/coll   "
              f"added {added[key]:6.1f} ns  (goal {'<= %.0f' % GOAL_NS[key] if GOAL_NS[key] else 'none'}; "
              f"medians' difference {med_added:.1f})   "
              f"runs base={['%.0f' % x for x in tb]} measured={['%.0f' % x for x in tc]}")
        print(f"{'':>28}  last run: records_emitted={st.get('records_emitted')} records_sent={st.get('records_sent')} "
              f"ring_full={st.get('records_dropped_ring_full')} pool_full={st.get('events_dropped_pool_full')} "
              f"received by sink={received}")
    instr = {1: float("nan"), "v7": float("nan"), "chain": float("nan"), "net": float("nan"), "vdso": float("nan")}
    if not args.no_callgrind and shutil.which("valgrind"):
        for key, label, abi, flags, (base, benv), (cand, cenv) in (configs[0], configs[2], configs[3], configs[4], configs[5]):
            base_i, cand_i = instr_per_coll(base, benv, abi, flags), instr_per_coll(cand, cenv, abi, flags)
            instr[key] = cand_i - base_i
            print(f"{label:>28}: instructions per collective {base.name} {base_i:.0f}  measured {cand_i:.0f}  "
                  f"added {instr[key]:.0f}  (callgrind, {INSTR_LONG}-{INSTR_SHORT} collectives)")
    ok = delivered and all(added[k] <= GOAL_NS[k] for k in added if GOAL_NS[k] is not None)
    print(f"profiler_added_ns_1thread={added[1]:.1f} profiler_added_ns_2threads={added[2]:.1f} "
          f"profiler_added_ns_v7_phases={added['v7']:.1f} chain_added_ns={added['chain']:.1f} "
          f"profiler_added_instr_1thread={instr[1]:.0f} profiler_added_instr_v7_phases={instr['v7']:.0f} "
          f"chain_added_instr={instr['chain']:.0f} net_added_ns={added['net']:.1f} net_added_instr={instr['net']:.0f} "
          f"vdso_added_ns={added['vdso']:.1f} vdso_added_instr={instr['vdso']:.0f} "
          f"load1={os.getloadavg()[0]:.1f} pass={int(ok)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
