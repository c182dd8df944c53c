"""`.ci/nccl-lib --sm N`: only the loadable code objects of other GPU architectures and the
relocatable copy are zeroed; headers, the kept architecture's code and every other byte stay."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    loader = importlib.machinery.SourceFileLoader("nccl_lib", str(ROOT / ".ci" / "nccl-lib"))
    spec = importlib.util.spec_from_loader("nccl_lib", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _entry(arch: int, payload: bytes) -> bytes:
    head = bytearray(64)                                  # kind, flags, header size, payload size ... arch at 28
    struct.pack_into("<HHIQ", head, 0, 2, 0, 64, len(payload))
    struct.pack_into("<I", head, 28, arch)
    return bytes(head) + payload


def _fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _elf(sections: dict[str, bytes]) -> bytes:
    """A minimal ELF64 file: the header, the sections' bytes, .shstrtab, the section headers."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    data, offs = bytearray(64), []
    for blob in [*sections.values(), names]:
        offs.append(len(data))
        data += blob + bytes(-len(blob) % 8)
    shoff = len(data)
    heads = [bytes(64)]
    pos = 1
    for i, (name, blob) in enumerate([*sections.items(), (".shstrtab", names)]):
        heads.append(struct.pack("<IIQQQQIIQQ", pos, 1, 0, 0, offs[i], len(blob), 0, 0, 8, 0))
        pos += len(name) + 1
    data += b"".join(heads)
    data[:4] = b"\x7fELF"
    data[4] = 2
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HHH", data, 0x3A, 64, len(heads), len(heads) - 1)
    return bytes(data)


def test_only_other_architectures_and_the_relocatable_copy_are_zeroed():
    tool = _tool()
    loaded = _fatbin(_entry(80, b"A" * 40), _entry(90, b"N" * 24), _entry(100, b"B" * 16))
    reloc = _fatbin(_entry(90, b"R" * 32))
    src = _elf({".text": b"T" * 24, ".nv_fatbin": loaded, "__nv_relfatbin": reloc})
    out = bytearray(src)
    kept, zeroed = tool.keep_one_sm(out, 90)
    assert (kept, zeroed) == (1, 40 + 16 + len(reloc))
    assert b"N" * 24 in out and b"T" * 24 in out                 # sm_90's code and other sections stay
    assert b"A" not in out[64:] and b"B" * 16 not in out and b"R" * 32 not in out
    assert len(out) == len(src) and out.count(0xBA55ED50 .to_bytes(4, "little")) == 1  # headers kept (reloc zeroed)


def test_a_file_that_is_no_elf_is_refused():
    with pytest.raises(SystemExit, match="not a 64-bit ELF"):
        _tool().keep_one_sm(bytearray(b"not an elf" * 10), 90)
