"""Parse what NCCL prints with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING``.

The lines used (NCCL 2.27-2.30 ``src/enqueue.cc``, ``src/init.cc``, ``src/plugin/*``), after
NCCL's ``host:pid:tid [dev] NCCL INFO`` prefix:

- ``NCCL version 2.28.9+cuda13.0``
- ``PROFILER/Plugin: Loaded dynamiccl (v6)`` / ``TUNER/Plugin: Using dynamiccl (v6)``
- ``AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}`` (rank 0 only,
  one per collective task)

>>> log = parse_lines([
...   "h:1:2 [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
...   "h:1:2 [0] NCCL INFO PROFILER/Plugin: Loaded dynamiccl (v6)",
...   "h:1:2 [0] NCCL INFO TUNER/Plugin: Using dynamiccl (v5)",
...   "h:1:2 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}",
...   "h:1:2 [0] NCCL INFO Broadcast: 8 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}"])
>>> log.version, log.profiler, log.tuner
('2.28.9+cuda13.0', ('dynamiccl', 6), ('dynamiccl', 5))
>>> log.choices
[('AllReduce', 1048576, 'RING', 'SIMPLE', 2), ('Broadcast', 8, 'RING', 'LL', 1)]
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

__all__ = ["NcclLog", "parse_lines", "parse_file"]

_VERSION = re.compile(r"NCCL INFO NCCL version (\S+)")
_PROFILER = re.compile(r"PROFILER/Plugin: Loaded (\S+) \(v(\d+)\)")
_TUNER = re.compile(r"TUNER/Plugin: Using (\S+) \(v(\d+)\)")
_CHOICE = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
_WARN = re.compile(r"NCCL WARN (.*)")


@dataclass
class NcclLog:
    version: str | None = None
    profiler: tuple[str, int] | None = None      # (plugin name, ABI version NCCL loaded)
    tuner: tuple[str, int] | None = None
    choices: list[tuple[str, int, str, str, int]] = field(default_factory=list)  # func, bytes, algo, proto, channels
    warnings: list[str] = field(default_factory=list)


def parse_lines(lines: Iterable[str]) -> NcclLog:
    log = NcclLog()
    for line in lines:
        m = _CHOICE.search(line)
        if m:
            lo, hi = int(m.group(5)), int(m.group(6))
            log.choices.append((m.group(1), int(m.group(2)), m.group(3).upper(), m.group(4).upper(), hi - lo + 1))
            continue
        if log.version is None and (m := _VERSION.search(line)):
            log.version = m.group(1)
        elif m := _PROFILER.search(line):
            log.profiler = (m.group(1), int(m.group(2)))
        elif m := _TUNER.search(line):
            log.tuner = (m.group(1), int(m.group(2)))
        elif (m := _WARN.search(line)) and len(log.warnings) < 50:
            log.warnings.append(m.group(1).strip())
    return log


def parse_file(path: str) -> NcclLog:
    with open(path, errors="replace") as f:
        return parse_lines(f)
