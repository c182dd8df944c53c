"""The tuner config file: what the retuner writes and the tuner plugin (C) reads while the job runs.

One text file (``DYNAMICCL_TUNER_CONFIG``, default per user and job: :mod:`dynamiccl.contracts.runtime_paths`), replaced atomically
(write a temporary file in the same directory, fsync, rename). It holds the **last few versions**,
newest last, so that a rank asked to apply version *v* (the MIN over ranks of what each has staged)
still has *v*'s rules even if it has already seen *v+1*::

    # dynamiccl tuner config format=2
    version 41
    AllReduce  0        65535  RING  LL      8  0  *
    version 42
    # func     min_bytes max_bytes algo proto channels chunk_bytes comm
    AllReduce  0        65535  RING  LL128   8  0  *
    AllGather  1048576  max    *     SIMPLE  0  0  0x1f2e3d4c5b6a7988
    # end lines=7 crc32=<zlib CRC-32 of the 7 lines above>

Format 2 (``format=2`` in the first line; :func:`format_configs` always writes it) must end with that
marker, so a file cut short is refused (the reader keeps what it has); format 1 (no ``format=2``
header, hand-written) needs none.

A version line may announce an epoch for jobs without the agreement hook (``version N at T``, T =
unix time in ns; the plugin's ``DYNAMICCL_TUNER_APPLY=epoch`` mode switches at T; see the README).

Fields per rule (whitespace separated): collective name as in NCCL (``AllReduce``, ``AllGather``,
``ReduceScatter``, ``Broadcast``, ``Reduce``, ``AllToAll``), inclusive per-rank byte range (``max`` = no
upper bound), algorithm (``TREE RING COLLNET_DIRECT COLLNET_CHAIN NVLS NVLS_TREE PAT`` or ``*``), protocol
(``LL LL128 SIMPLE`` or ``*``), channel count (0 = NCCL's), chunk size in bytes (0 = NCCL's; v6
``getChunkSize``), communicator hash (``0x…``) or ``*``. The first matching rule wins. Version 0 means
"no config": NCCL's own choice.

The grammar is strict and shared with the C parser (``dynamiccl/nccl_tuner_plugin/src/rules.c``): lines split on
``\n``, ``#`` starts a comment, tokens split on ASCII blanks, decimal digits only (no sign, no ``_``),
at most 1023 characters of non-comment text per line, at most ``MAX_FILE_BYTES``. Version numbers
only grow and are never reused with other rules (:func:`write_configs` refuses both; the plugin
rejects such a file and keeps its last good config).

:func:`apply_rule` is the reference semantics the C plugin implements (tests compare the two).

>>> cfg = TunerConfig(version=3, rules=(Rule("AllReduce", 0, 65535, algo="RING", proto="LL", n_channels=4),))
>>> text = format_configs([cfg])
>>> parse_configs(text) == [cfg]
True
>>> import numpy as np
>>> table = np.full((7, 3), 50.0); table[1, 0] = 80.0; table[6, :] = -1.0
>>> t, nch, chunk = apply_rule(cfg, table, "AllReduce", 4096, comm_hash=0x1)
>>> float(t[1, 0]), nch, chunk      # RING/LL forced to cost 0, 4 channels
(0.0, 4, 0)
>>> t, nch, _ = apply_rule(cfg, table, "AllReduce", 1 << 20, comm_hash=0x1)
>>> bool((t == table).all()), nch   # no rule for 1 MiB: NCCL's choice stands
(True, 0)
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.contracts.collectives import ALGOS, PROTOS
from dynamiccl.contracts.collectives import TUNER_FUNCS as FUNCS
from dynamiccl.contracts.tuner_file import (DEFAULT_PATH, ENV_VAR, HEADER, MAX_CHANNELS, MAX_FILE_BYTES,
                                            TRAILER_FORMAT,
                                            MAX_LINE_CHARS, MAX_RULES, MAX_VERSIONS, U64_MAX)

__all__ = ["ALGOS", "PROTOS", "FUNCS", "MAX_RULES", "MAX_VERSIONS", "MAX_FILE_BYTES", "MAX_LINE_CHARS",
           "DEFAULT_PATH", "ENV_VAR", "U64_MAX", "Rule", "TunerConfig", "format_configs", "parse_configs",
           "read_configs", "write_configs", "next_version", "apply_rule"]


@dataclass(frozen=True)
class Rule:
    func: str
    min_bytes: int = 0
    max_bytes: int = U64_MAX
    algo: str | None = None      # None = "*": any enabled algorithm
    proto: str | None = None     # None = "*"
    n_channels: int = 0          # 0 = NCCL's
    chunk_bytes: int = 0         # 0 = NCCL's
    comm_hash: int | None = None  # None = any communicator

    def __post_init__(self) -> None:
        if self.func not in FUNCS:
            raise ValueError(f"tuner rule: unknown collective {self.func!r} (expected one of {', '.join(FUNCS)})")
        if self.algo is not None and self.algo not in ALGOS:
            raise ValueError(f"tuner rule: unknown algorithm {self.algo!r} (expected one of {', '.join(ALGOS)} or *)")
        if self.proto is not None and self.proto not in PROTOS:
            raise ValueError(f"tuner rule: unknown protocol {self.proto!r} (expected one of {', '.join(PROTOS)} or *)")
        if not (0 <= self.min_bytes <= self.max_bytes <= U64_MAX):
            raise ValueError(f"tuner rule: bad byte range {self.min_bytes}..{self.max_bytes}")
        if not (0 <= self.n_channels <= MAX_CHANNELS):
            raise ValueError(f"tuner rule: channel count {self.n_channels} outside 0..{MAX_CHANNELS}")
        if not (0 <= self.chunk_bytes <= U64_MAX):
            raise ValueError(f"tuner rule: chunk size {self.chunk_bytes} outside 0..2^64-1")
        if self.comm_hash is not None and not (0 <= self.comm_hash <= U64_MAX):
            raise ValueError(f"tuner rule: communicator hash {self.comm_hash} outside 0..2^64-1")

    def matches(self, func: str, nbytes: int, comm_hash: int) -> bool:
        return (func == self.func and self.min_bytes <= nbytes <= self.max_bytes
                and (self.comm_hash is None or self.comm_hash == comm_hash))

    def format(self) -> str:
        hi = "max" if self.max_bytes == U64_MAX else str(self.max_bytes)
        comm = "*" if self.comm_hash is None else f"0x{self.comm_hash:016x}"
        return (f"{self.func} {self.min_bytes} {hi} {self.algo or '*'} {self.proto or '*'} "
                f"{self.n_channels} {self.chunk_bytes} {comm}")


@dataclass(frozen=True)
class TunerConfig:
    version: int
    rules: tuple[Rule, ...] = ()
    apply_at_ns: int = 0          # epoch mode only: unix time (ns) at which ranks switch; 0 = none

    def __post_init__(self) -> None:
        if not (0 < self.version < (1 << 63)):
            raise ValueError(f"tuner config: version must be a positive integer, got {self.version}")
        if not (0 <= self.apply_at_ns < (1 << 63)):
            raise ValueError(f"tuner config: apply_at_ns must be in 0..2^63-1, got {self.apply_at_ns}")
        if len(self.rules) > MAX_RULES:
            raise ValueError(f"tuner config: {len(self.rules)} rules, the plugin holds at most {MAX_RULES}")

    def lookup(self, func: str, nbytes: int, comm_hash: int) -> Rule | None:
        for r in self.rules:
            if r.matches(func, nbytes, comm_hash):
                return r
        return None


def format_configs(configs: list[TunerConfig]) -> str:
    if len(configs) > MAX_VERSIONS:
        raise ValueError(f"tuner config: {len(configs)} versions, a file keeps at most {MAX_VERSIONS}")
    vs = [c.version for c in configs]
    if vs != sorted(set(vs)):
        raise ValueError(f"tuner config: versions must be strictly increasing, got {vs}")
    out = [HEADER]
    for c in configs:
        out.append(f"version {c.version}" + (f" at {c.apply_at_ns}" if c.apply_at_ns else ""))
        out.extend(r.format() for r in c.rules)
    body = "\n".join(out) + "\n"
    return body + TRAILER_FORMAT.format(lines=len(out), crc=zlib.crc32(body.encode())) + "\n"


_TRAILER = re.compile(r"# end lines=([0-9]{1,9}) crc32=([0-9a-f]{8})\n", re.ASCII)


def _strip_trailer(text: str, source: str) -> str:
    """Format 2 (the header line says so): the body before a valid end marker, else a ValueError."""
    if text and len(text) <= len(HEADER) and HEADER.startswith(text):
        raise ValueError(f"{source}: torn file: cut inside the format-2 header")
    if not (text.startswith(HEADER) and text[len(HEADER):len(HEADER) + 1] in ("\n", "\r")):
        return text                                   # format 1: no trailer required
    cut = text.rfind("\n", 0, len(text) - 1) + 1
    m = _TRAILER.fullmatch(text, cut) if text.endswith("\n") else None
    body = text[:cut]
    if m is None:
        raise ValueError(f"{source}: torn file: no valid '# end lines=K crc32=X' line at the end (format 2)")
    if int(m.group(1)) != body.count("\n") or int(m.group(2), 16) != zlib.crc32(body.encode()):
        raise ValueError(f"{source}: torn file: the end marker does not match the content (format 2)")
    return body


_DEC = re.compile(r"[0-9]+", re.ASCII)
_HEX = re.compile(r"(?:0[xX])?[0-9a-fA-F]{1,16}", re.ASCII)
_BLANKS = re.compile(r"[ \t\r\v\f]+")


def _dec(s: str, what: str, where: str) -> int:
    if not _DEC.fullmatch(s):
        raise ValueError(f"{where}: bad {what} {s[:40]!r} (decimal digits only)")
    return int(s)


def _parse_rule(tok: list[str], where: str) -> Rule:
    if len(tok) != 8:
        raise ValueError(f"{where}: expected 8 fields (func min max algo proto channels chunk comm), got {len(tok)}")
    func, lo, hi, algo, proto, nch, chunk, comm = tok
    lo_v = _dec(lo, "min_bytes", where)
    hi_v = U64_MAX if hi == "max" else _dec(hi, "max_bytes", where)
    nch_v = _dec(nch, "channel count", where)
    chunk_v = _dec(chunk, "chunk size", where)
    if comm != "*" and not _HEX.fullmatch(comm):
        raise ValueError(f"{where}: bad communicator hash {comm[:40]!r}")
    try:
        return Rule(func, lo_v, hi_v, None if algo == "*" else algo, None if proto == "*" else proto, nch_v,
                    chunk_v, None if comm == "*" else int(comm, 16))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def parse_configs(text: str, source: str = "<config>") -> list[TunerConfig]:
    """Parse a whole file; a bad line is an error naming the line (the plugin then keeps its last good config)."""
    if len(text.encode()) > MAX_FILE_BYTES:
        raise ValueError(f"{source}: file larger than {MAX_FILE_BYTES} bytes")
    text = _strip_trailer(text, source)
    configs: list[TunerConfig] = []
    head: tuple[int, int] | None = None       # (version, apply_at_ns) of the version being read
    rules: list[Rule] = []
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.split("#", 1)[0]
        where = f"{source}:{n}"
        if len(line) > MAX_LINE_CHARS:
            raise ValueError(f"{where}: longer than {MAX_LINE_CHARS} characters")
        if "\0" in line:
            raise ValueError(f"{where}: NUL byte")
        tok = [t for t in _BLANKS.split(line) if t]
        if not tok:
            continue
        if tok[0] == "version":
            ok = (len(tok) == 2 or (len(tok) == 4 and tok[2] == "at")) and all(
                _DEC.fullmatch(t) and int(t) < (1 << 63) for t in tok[1::2])
            if not ok:
                raise ValueError(f"{where}: expected 'version N' or 'version N at T_NS'")
            if head is not None:
                configs.append(TunerConfig(head[0], tuple(rules), head[1]))
            v = int(tok[1])
            if v == 0:
                raise ValueError(f"{where}: version must be a positive integer, got 0")
            if configs and v <= configs[-1].version:
                raise ValueError(f"{where}: versions must be strictly increasing ({v} after {configs[-1].version})")
            if len(configs) == MAX_VERSIONS:
                raise ValueError(f"{where}: more than {MAX_VERSIONS} versions in one file")
            head, rules = (v, int(tok[3]) if len(tok) == 4 else 0), []
        elif head is None:
            raise ValueError(f"{where}: rule before the first 'version N' line")
        else:
            if len(rules) == MAX_RULES:
                raise ValueError(f"{where}: more than {MAX_RULES} rules in version {head[0]}")
            rules.append(_parse_rule(tok, where))
    if head is not None:
        configs.append(TunerConfig(head[0], tuple(rules), head[1]))
    return configs


def read_configs(path: str | os.PathLike) -> list[TunerConfig]:
    p = Path(path)
    return parse_configs(p.read_text(), str(p))


def write_configs(path: str | os.PathLike, configs: list[TunerConfig]) -> None:
    """Atomic replace: readers see the old file or the new one, never a partial one.

    Refuses (``ValueError``) to reuse a version number of the file already at ``path`` with other
    rules, and to go back to versions older than its newest: ranks that read the old file would
    apply different rules under the same number. Keep the newest :data:`MAX_VERSIONS` versions and
    drop only the oldest (the agreement hook relies on every file being a contiguous window).
    """
    text = format_configs(configs)
    p = Path(path)
    try:
        old = {c.version: c for c in read_configs(p)}
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        old = {}
    for c in configs:
        if c.version in old and old[c.version] != c:
            raise ValueError(f"tuner config: version {c.version} already exists in {p} with other rules "
                             "(version numbers must never be reused)")
    if old and configs and configs[-1].version < max(old):
        raise ValueError(f"tuner config: newest version {configs[-1].version} is older than {max(old)} in {p} "
                         "(versions must only grow)")
    atomic_write(p, text)


def next_version(path: str | os.PathLike) -> int:
    """The version number a (re)started writer should use next: newest version in ``path`` + 1 (1 when the
    file is missing, empty or unreadable)."""
    try:
        configs = read_configs(path)
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return 1
    return configs[-1].version + 1 if configs else 1


def nccl_clamps_channels(algo: str, n_nodes: int) -> bool:
    """Whether NCCL clamps a tuner's channel budget for this algorithm to the channels it built: all but
    its "collnet" tasks (CollNet Direct/Chain, and NVLS across nodes), which use the budget as given; the
    plugin writes a budget only where NCCL clamps it."""
    return algo not in ("COLLNET_DIRECT", "COLLNET_CHAIN") and not (algo == "NVLS" and n_nodes > 1)


def apply_rule(cfg: TunerConfig | None, cost_table, func: str, nbytes: int,
               comm_hash: int, n_nodes: int = 1) -> tuple:
    """Reference semantics of the plugin's ``getCollInfo`` (+ ``getChunkSize``) for one call.

    Returns (table, nChannels, chunk_bytes). The first matching rule selects, among the *enabled*
    cells (cost >= 0) allowed by its algo/proto, the cheapest one and sets it to 0.0; a −1 cell is never
    revived. Its channel count is returned only where NCCL clamps it (:func:`nccl_clamps_channels`), else
    0. No rule, or no enabled cell allowed: the table is returned unchanged with 0 channels (NCCL's choice
    stands).
    """
    import numpy as np     # the reference semantics only; the file format needs no numpy
    table = np.array(cost_table, dtype=np.float64, copy=True)
    rule = cfg.lookup(func, nbytes, comm_hash) if cfg is not None else None
    if rule is None:
        return table, 0, 0
    allowed = np.ones(table.shape, dtype=bool)
    if rule.algo is not None:
        allowed[:] = False
        a = ALGOS.index(rule.algo)
        if a < table.shape[0]:
            allowed[a, :] = True
    if rule.proto is not None:
        mask = np.zeros(table.shape, dtype=bool)
        p = PROTOS.index(rule.proto)
        if p < table.shape[1]:
            mask[:, p] = True
        allowed &= mask
    cand = np.where(allowed & (table >= 0), table, np.inf)
    best = int(np.argmin(cand))
    if not np.isfinite(cand.flat[best]):
        return table, 0, 0
    table.flat[best] = 0.0
    algo = ALGOS[best // table.shape[1]] if best // table.shape[1] < len(ALGOS) else ""
    return table, (rule.n_channels if nccl_clamps_channels(algo, n_nodes) else 0), rule.chunk_bytes
