"""Feature-stream line reader: CPU time per line size, the contracts' LineSplitter against the quadratic
append-and-resplit reader it replaced (baseline, measured in the same run).

    python benchmarks/line_reader.py [--mb 28] [--chunk-kib 64]

Pass: the reader reads the line at least 20x faster than the baseline, and a 4x longer line costs it at most 3x
one copy of that line (``b"".join`` of its chunks, the least any reader must do; the baseline costs hundreds of
copies). CPU time, process_time: other processes on the machine do not inflate it). Seeded content; last line
``key=value ... pass=0|1``.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamiccl.contracts.lines import LineSplitter  # noqa: E402


def quadratic(chunks):
    """The reader dynamiccl/retuner/service.py had: ``buf += chunk`` then split the whole buffer again."""
    buf, out = b"", []
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        out += [x for x in lines if x.strip()]
    return out


def linear(chunks):
    s, out = LineSplitter(max_line_bytes=1 << 30), []
    for chunk in chunks:
        out += s.feed(chunk)
    return out


def one_copy(chunks):
    return [b"".join(chunks)]


def cpu(fn, chunks, reps: int = 1) -> tuple[float, list]:
    """Least CPU time over ``reps`` runs (the reader's own cost, not a stray page-fault burst)."""
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.process_time()
        out = fn(chunks)
        best = min(best, time.process_time() - t)
    return best, out


def make(nbytes: int, chunk: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    body = bytes(rng.choice(b"0123456789abcdef,:") for _ in range(4096)) * (nbytes // 4096 + 1)
    line = b'{"v":1,"keys":"' + body[:nbytes] + b'"}\n'
    return [line[i:i + chunk] for i in range(0, len(line), chunk)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=28.0, help="line size in MB (a 512-node window is ~28)")
    ap.add_argument("--chunk-kib", type=int, default=64, help="bytes per recv, KiB")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n, c = int(args.mb * (1 << 20)), args.chunk_kib << 10
    line, line4 = make(n, c, args.seed), make(4 * n, c, args.seed)
    lin, out_lin = cpu(linear, line, reps=7)
    lin4, _ = cpu(linear, line4, reps=7)
    copy4, _ = cpu(one_copy, line4, reps=7)
    del line4
    quad, out_quad = cpu(quadratic, line)
    same = out_lin == out_quad and len(out_lin) == 1
    speedup = quad / max(lin, 1e-9)
    copies = lin4 / max(copy4, 1e-9)
    ok = same and speedup >= 20 and copies <= 3
    print(f"line_mb={args.mb:g} chunk_kib={args.chunk_kib} linear_cpu_s={lin:.4f} "
          f"linear_4x_cpu_s={lin4:.4f} copy_4x_cpu_s={copy4:.4f} baseline_cpu_s={quad:.3f} speedup={speedup:.0f} "
          f"copies_4x={copies:.2f} same_lines={int(same)} load1={os.getloadavg()[0]:.2f} pass={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
