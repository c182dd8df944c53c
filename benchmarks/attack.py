"""Attacks on a collector while a legitimate job reports to it; one line per attack.

For each attack a fresh collector (``dynamiccl collector``, a child process: Unix socket, TCP,
/metrics, parquet history) runs; a legitimate job sends records with wall-clock event times over
the Unix socket while an attacker process works over TCP. Measured per attack:

* ``legit_ratio``: the legitimate job's records in closed windows of the collector's feature
  stream (what the detector and the retuner see) / records it sent — target >= 0.99;
  ``legit_lag_s``: from its last record sent to its last window closed (informative);
  ``legit_in_metrics``: whether its ``dynamiccl_collectives_total`` series are on /metrics;
* ``metrics_max_bytes`` / ``metrics_max_s``: the largest /metrics body and slowest scrape (polled
  every 0.5 s) — targets < 5 MB and < 1 s;
* ``rss_max_bytes``: the collector's resident memory plus its parquet writer's — target < 1 GB;
* ``sigterm_s``: SIGTERM to exit — target < 5 s.

Attacks (issue 18): a forged record stream; frames whose records span hours; 1,024 idle and 50
slow-loris connections; 100 k forged host/job labels; a host whose clock runs 30 s ahead.
Seeded; the last line is key=value with ``pass=0|1``. A few minutes in all.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dynamiccl.harness.collector_testing import encode_frame, encode_frames, process_record, synthetic_events  # noqa: E402
from dynamiccl.collector.wire_format import EVENT_DTYPE  # noqa: E402

LEGIT_JOB, LEGIT_COMM = "legit-job", 0x1E61_0000_0000_0001
TARGETS = {"legit_ratio": 0.99, "metrics_max_bytes": 5e6, "metrics_max_s": 1.0, "rss_max_bytes": 1e9,
           "sigterm_s": 5.0}


def _hello(host: str, job: str, pid: int) -> bytes:
    return encode_frame(process_record(host, job, pid, start_ns=time.time_ns()).view(EVENT_DTYPE))


def _records(n_inst: int, *, seed: int, seq: int, comm: int, offset_ns: int = 0, tick_s: float = 0.1):
    # a training job's mix: three collectives, four message sizes (1 .. 16 MiB)
    return synthetic_events(n_inst, nranks=2, seed=seed, seq_base=seq, comm_hashes=(comm,),
                            funcs=("AllReduce", "AllGather", "ReduceScatter"), log2_bytes=(20, 24),
                            start_ns=time.time_ns() + offset_ns - int(tick_s * 1e9),
                            rate_per_s=n_inst / tick_s, untimed_fraction=0.0, cpu_timed_fraction=0.0)


def _tcp(addr: str) -> socket.socket:
    host, port = addr[4:].rsplit(":", 1)
    return socket.create_connection((host, int(port)))


# -- senders (child processes) ------------------------------------------------------------------
def paced_job(address: str, host: str, job: str, comm: int, rate: float, duration: float, out,
              offset_ns: int = 0, seed: int = 0) -> None:
    """A job sending ``rate`` records/s for ``duration`` s (event times = wall clock + offset)."""
    s = socket.socket(socket.AF_UNIX) if address.startswith("unix:") else None
    if s is not None:
        s.connect(address[5:])
    else:
        s = _tcp(address)
    s.sendall(_hello(host, job, os.getpid()))
    sent, seq, tick = 0, 1, 0.1
    end = time.monotonic() + duration
    next_t = time.monotonic()
    while time.monotonic() < end:
        n_inst = max(1, int(rate * tick / 2))
        ev = _records(n_inst, seed=seed + seq, seq=seq, comm=comm, offset_ns=offset_ns)
        try:
            s.sendall(encode_frames(ev, per_frame=1024))
        except OSError:
            break
        sent, seq = sent + len(ev), seq + n_inst
        next_t += tick
        time.sleep(max(0.0, next_t - time.monotonic()))
    s.close()
    out.put(sent)


def forged_stream(tcp: str, duration: float) -> None:
    """An unauthenticated peer claiming the legitimate job, a 2x slowdown, at 100 k records/s."""
    q = mp.Queue()
    paced_job(tcp, "forger", LEGIT_JOB, 0xF0F0, 100_000, duration, q, seed=7)


def hour_spanning(tcp: str, duration: float) -> None:
    """4,000-record frames whose event times spread over +-12 h, 8 frames a second."""
    rng = np.random.default_rng(1)
    s = _tcp(tcp)
    s.sendall(_hello("spanner", "span-job", os.getpid()))
    end, seq = time.monotonic() + duration, 1
    while time.monotonic() < end:
        ev = _records(2000, seed=seq, seq=seq, comm=0x5A5A)
        shift = rng.integers(-12 * 3600, 12 * 3600, len(ev)).astype(np.int64) * 10**9
        for f in ("gpu_start_ns", "gpu_end_ns", "enqueue_ns", "cpu_end_ns"):
            ev[f] = (ev[f].astype(np.int64) + shift).astype(np.uint64)
        try:
            s.sendall(encode_frame(ev))
        except OSError:
            s = _tcp(tcp)
            s.sendall(_hello("spanner", "span-job", os.getpid()))
        seq += 2000
        time.sleep(0.125)


def idle_and_slowloris(tcp: str, duration: float) -> None:
    """1,024 connections that say nothing and 50 that send a frame one byte a second."""
    idle = []
    for _ in range(1024):
        try:
            idle.append(_tcp(tcp))
        except OSError:
            pass
    payload = _hello("loris", "loris-job", os.getpid()) + encode_frame(_records(8, seed=0, seq=1, comm=1))
    loris = [[None, 0] for _ in range(50)]
    end = time.monotonic() + duration
    while time.monotonic() < end:
        for slot in loris:
            try:
                if slot[0] is None:
                    slot[0], slot[1] = _tcp(tcp), 0
                slot[0].send(payload[slot[1]:slot[1] + 1])
                slot[1] = (slot[1] + 1) % len(payload)
            except OSError:
                slot[0] = None  # closed by the collector: come back
        time.sleep(1.0)
    for s in idle:
        s.close()


def forged_labels(tcp: str, duration: float, n_labels: int = 100_000) -> None:
    """A connection per fresh host/job label set (PROCESS + 4 records), ``n_labels`` of them."""
    ev = _records(2, seed=3, seq=1, comm=0xBAD)
    body = encode_frame(ev)
    end = time.monotonic() + max(duration, 90.0)
    for i in range(n_labels):
        if time.monotonic() > end:
            break
        try:
            s = _tcp(tcp)
            s.sendall(_hello(f"h{i}", f"j{i}", i) + body)
            s.close()
        except OSError:
            time.sleep(0.01)


def clock_ahead(tcp: str, duration: float) -> None:
    """Another job on a host whose clock runs 30 s ahead, at the legitimate job's rate."""
    paced_job(tcp, "ahead-host", "skewed-job", 0xA4EAD, 10_000, duration, mp.Queue(), offset_ns=30 * 10**9, seed=9)


ATTACKS = {"forged_stream": forged_stream, "hour_spanning": hour_spanning,
           "idle_and_slowloris": idle_and_slowloris, "forged_labels": forged_labels, "clock_ahead": clock_ahead}


# -- the collector under attack ------------------------------------------------------------------
def start_collector(d: str) -> tuple[subprocess.Popen, str, str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dynamiccl", "collector", "--listen", f"unix:{d}/c.sock",
         "--listen", "tcp:127.0.0.1:0", "--metrics", "127.0.0.1:0", "--features", "tcp:127.0.0.1:0",
         "--parquet", f"{d}/pq", "--gpu-telemetry", "off"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=open(f"{d}/collector.log", "w"), text=True)
    line = proc.stdout.readline()
    m = re.search(r"listen=(\S+) metrics=(\S+) features=(\S+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"collector did not start: {line!r}; see {d}/collector.log")
    unix, tcp = m.group(1).split(",")
    return proc, unix, tcp, m.group(2), m.group(3)


class LegitCounter:
    """Sums the legitimate job's records over the feature stream's closed windows. Why it stopped
    reading (``error``) is kept and printed: a counter that died would otherwise read as a job whose
    records were lost (``legit_ratio`` 0.0)."""

    def __init__(self, address: str):
        from dynamiccl.collector.features import subscribe
        self.records, self.windows = 0, 0
        self.error = ""
        self._it = subscribe(address, timeout=None)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for wf in self._it:
                k = wf.keys
                mine = k.filter((k["job_id"] == LEGIT_JOB) & (k["comm_hash"] == LEGIT_COMM))
                self.records += int(mine["records"].sum())
                self.windows += 1
            self.error = "feature stream closed"
        except Exception as exc:  # noqa: BLE001 - reported, never swallowed
            self.error = f"{type(exc).__name__}: {exc}"[:120].replace(" ", "_")


def _children(pid: int) -> list[int]:
    out = []
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (t / "children").read_text().split()]
        except OSError:  # a thread that just ended
            pass
    return out


def rss(pid: int) -> int:
    total = 0
    for p in [pid] + _children(pid):
        try:
            for ln in Path(f"/proc/{p}/status").read_text().splitlines():
                if ln.startswith("VmRSS:"):
                    total += int(ln.split()[1]) * 1024
        except OSError:
            pass
    return total


def scrape(addr: str) -> tuple[str, float, float]:
    """(body, seconds to the whole body, seconds to the response headers: the server's share)."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
            headers = time.monotonic() - t0
            body = r.read().decode()
    except OSError:
        return "", float("inf"), float("inf")
    return body, time.monotonic() - t0, headers


def legit_in_metrics(body: str) -> int:
    want = (f'job_id="{LEGIT_JOB}"', f'comm="{LEGIT_COMM:016x}"')
    return int(sum(float(ln.rsplit(" ", 1)[1]) for ln in body.splitlines()
                   if ln.startswith("dynamiccl_collectives_total{") and all(w in ln for w in want)))


def run_attack(name: str, duration: float, legit_rate: float) -> dict:
    d = tempfile.mkdtemp(prefix="dccl-attack")
    proc, unix, tcp, maddr, faddr = start_collector(d)
    counter = LegitCounter(faddr)
    out = mp.Queue()
    legit = mp.Process(target=paced_job, args=(unix, "legit-host", LEGIT_JOB, LEGIT_COMM, legit_rate,
                                               duration, out))
    attacker = mp.Process(target=ATTACKS[name], args=(tcp, duration), daemon=True)
    attacker.start()
    time.sleep(1.0)  # the attack is under way before the job starts
    legit.start()
    res = {"metrics_max_bytes": 0, "metrics_max_s": 0.0, "metrics_max_headers_s": 0.0, "rss_max_bytes": 0}
    while legit.is_alive() or attacker.is_alive():
        body, took, headers = scrape(maddr)
        res["metrics_max_bytes"] = max(res["metrics_max_bytes"], len(body))
        res["metrics_max_s"] = max(res["metrics_max_s"], took)
        res["metrics_max_headers_s"] = max(res["metrics_max_headers_s"], headers)
        res["rss_max_bytes"] = max(res["rss_max_bytes"], rss(proc.pid))
        time.sleep(0.5)
        if not legit.is_alive() and time.monotonic() > 0 and attacker.is_alive():
            attacker.join(timeout=0 if name != "forged_labels" else 120)
            attacker.terminate()
    sent = out.get()
    t_end = time.monotonic()
    still, got = 0, -1
    while counter.records < sent and still < 5:  # windows close after the idle flush
        time.sleep(1.0)
        still, got = (still + 1, got) if counter.records == got else (0, counter.records)
    res["legit_lag_s"] = time.monotonic() - t_end  # until its last window closed (or gave up)
    res["legit_ratio"] = counter.records / max(sent, 1)
    res["counter"] = f"{counter.windows}w" + (f",{counter.error}" if counter.error else "")
    body, took, _ = scrape(maddr)
    res["legit_in_metrics"] = int(legit_in_metrics(body) > 0)
    res["metrics_max_bytes"] = max(res["metrics_max_bytes"], len(body))
    res["metrics_max_s"] = max(res["metrics_max_s"], took)
    final = scrape(maddr)[0]
    res["dropped"] = ",".join(f"{k}:{int(float(v))}" for k, v in re.findall(
        r'dynamiccl_collector_records_dropped_total\{reason="(\w+)"\} (\S+)', final) if float(v))
    # windows the collector dropped from a slow subscriber's queue (this benchmark's counter falling behind)
    fw = re.search(r"^dynamiccl_collector_feature_windows_dropped_total (\S+)", final, re.M)
    res["feature_windows_dropped"] = int(float(fw.group(1))) if fw else -1
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    res["sigterm_s"] = time.monotonic() - t0
    res["legit_sent"] = sent
    return res


def _kv(**fields) -> str:
    """``key=value ...`` with the load average before ``pass`` (``pass_`` names the last key)."""
    last = fields.pop("pass_")
    fields["load1"] = f"{os.getloadavg()[0]:.2f}"
    return " ".join(f"{k}={v}" for k, v in fields.items()) + f" pass={last}"


def ok(res: dict) -> bool:
    return (res["legit_ratio"] >= TARGETS["legit_ratio"] and res["metrics_max_bytes"] < TARGETS["metrics_max_bytes"]
            and res["metrics_max_s"] < TARGETS["metrics_max_s"] and res["rss_max_bytes"] < TARGETS["rss_max_bytes"]
            and res["sigterm_s"] < TARGETS["sigterm_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=15.0, help="seconds the legitimate job runs per attack")
    ap.add_argument("--legit-rate", type=float, default=10_000, help="legitimate records/s")
    ap.add_argument("--only", choices=sorted(ATTACKS), action="append", help="run only these attacks")
    args = ap.parse_args()
    worst = {"legit_ratio": 1.0, "metrics_max_bytes": 0, "metrics_max_s": 0.0, "rss_max_bytes": 0, "sigterm_s": 0.0}
    all_ok = True
    for name in args.only or ATTACKS:
        r = run_attack(name, args.duration, args.legit_rate)
        passed = ok(r)
        all_ok &= passed
        print(_kv(attack=name, legit_sent=r["legit_sent"], legit_ratio=f"{r['legit_ratio']:.4f}",
                  legit_lag_s=f"{r['legit_lag_s']:.1f}", legit_in_metrics=r["legit_in_metrics"], metrics_max_bytes=r["metrics_max_bytes"],
                  metrics_max_s=f"{r['metrics_max_s']:.3f}", metrics_headers_s=f"{r['metrics_max_headers_s']:.3f}",
                  rss_max_mb=round(r["rss_max_bytes"] / 2**20),
                  sigterm_s=f"{r['sigterm_s']:.2f}", dropped=r["dropped"] or "-", counter=r["counter"],
                  feature_windows_dropped=r["feature_windows_dropped"], pass_=int(passed)), flush=True)
        worst["legit_ratio"] = min(worst["legit_ratio"], r["legit_ratio"])
        for k in ("metrics_max_bytes", "metrics_max_s", "rss_max_bytes", "sigterm_s"):
            worst[k] = max(worst[k], r[k])
    print(_kv(attacks=len(args.only or ATTACKS), min_legit_ratio=f"{worst['legit_ratio']:.4f}",
              max_metrics_bytes=worst["metrics_max_bytes"], max_metrics_s=f"{worst['metrics_max_s']:.3f}",
              max_rss_mb=round(worst["rss_max_bytes"] / 2**20), max_sigterm_s=f"{worst['sigterm_s']:.2f}",
              pass_=int(all_ok)))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
