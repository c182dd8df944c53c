"""The C plugin against the Python reference: the same files are accepted or rejected by both parsers,
and getCollInfo/getChunkSize give what ``config.apply_rule`` gives, on random tables and rules."""
from __future__ import annotations

import random
import zlib

import numpy as np
import pytest

from dynamiccl.nccl_tuner_plugin import config as C
from dynamiccl.nccl_tuner_plugin.config import ALGOS, FUNCS, PROTOS, U64_MAX, Rule, TunerConfig, apply_rule

COMMS = (0x1111, 0xABCDEF0123456789, 0x42)
# The NCCL-path guard the C plugin adds on top of config.apply_rule: the chunk rounded up to the
# protocol grain, capped (the channel rule is apply_rule's own: nccl_clamps_channels).
PROTO_GRAIN = (16, 1920, 512)
MAX_CHUNK = 1 << 30
N_NODES = 2     # the communicators below are initialised with 16 ranks on 2 nodes


def apply_rule_nccl(cfg, table, func, nbytes, comm):
    return apply_rule(cfg, table, func, nbytes, comm, n_nodes=N_NODES)


def chunk_for_proto(chunk: int, proto: int) -> int:
    g = PROTO_GRAIN[proto]
    return -(-min(chunk, MAX_CHUNK) // g) * g
BOUNDS = (0, 1, 100, 4096, 65536, 1 << 20, 1 << 30, U64_MAX)


def random_rule(rng: random.Random) -> Rule:
    lo, hi = sorted(rng.sample(BOUNDS, 2)) if rng.random() < 0.8 else (rng.choice(BOUNDS),) * 2
    return Rule(rng.choice(FUNCS), lo, hi,
                rng.choice((None, *ALGOS)), rng.choice((None, *PROTOS)), rng.choice((0, 0, 1, 4, 16, 64)),
                rng.choice((0, 0, 4096, 131072, 1 << 20)), rng.choice((None, None, *COMMS)))


def random_configs(rng: random.Random, first: int) -> list[TunerConfig]:
    out, v = [], first
    for _ in range(rng.randint(1, C.MAX_VERSIONS)):
        out.append(TunerConfig(v, tuple(random_rule(rng) for _ in range(rng.randint(0, 12))),
                               rng.choice((0, 0, 1767225600 * 10**9))))
        v += rng.randint(1, 3)
    return out


def mutate(rng: random.Random, text: str) -> str:
    """A small random edit of a valid file: most results are invalid, some stay valid."""
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    tok = lines[i].split()
    edits = ["drop_token", "dup_token", "swap", "garbage", "case", "sign", "big", "dup_line", "hex", "at", "number",
             "number"]
    e = rng.choice(edits)
    nums = [k for k, t in enumerate(tok) if t.isdigit()]
    if nums and e == "number":      # edits of a decimal field: some valid (leading zero), most not
        k = rng.choice(nums)
        tok[k] = rng.choice(("+{}", "{}_0", "0{}", "{}.0", "{}e0", "0x{}", " {}", "{}L")).format(tok[k])
    elif tok and e == "drop_token":
        tok.pop(rng.randrange(len(tok)))
    elif tok and e == "dup_token":
        tok.insert(rng.randrange(len(tok)), rng.choice(tok))
    elif len(tok) > 1 and e == "swap":
        a, b = rng.sample(range(len(tok)), 2)
        tok[a], tok[b] = tok[b], tok[a]
    elif tok and e == "garbage":
        tok[rng.randrange(len(tok))] = rng.choice(("x", "-1", "+3", "1_0", "0x", "١", "max", "*", "1e3", "\x00"))
    elif tok and e == "case":
        k = rng.randrange(len(tok))
        tok[k] = tok[k].lower() if rng.random() < 0.5 else tok[k].upper()
    elif tok and e == "sign":
        tok[rng.randrange(len(tok))] = "-" + tok[rng.randrange(len(tok))]
    elif tok and e == "big":
        tok[rng.randrange(len(tok))] = str(rng.choice((2**63, 2**64, 2**64 - 1, 2**63 - 1, 65)))
    elif e == "dup_line":
        lines.insert(i, lines[i])
    elif tok and e == "hex":
        tok[-1] = rng.choice(("0X1F", "1f", "0x" + "f" * 17, "g1", "0x0"))
    elif tok and e == "at" and tok[0] == "version":
        tok = tok[:2] + rng.choice((["at", "5"], ["at"], ["AT", "5"], ["at", "5", "6"]))
    lines[i] = " ".join(tok)
    return "\n".join(lines)


def seal(body: str) -> str:
    """A format-2 file of ``body`` with a valid end marker."""
    body = body if body.endswith("\n") else body + "\n"
    return body + f"# end lines={body.count(chr(10))} crc32={zlib.crc32(body.encode('utf-8', 'surrogatepass')):08x}\n"


def python_accepts(text: str) -> tuple[bool, list[TunerConfig]]:
    try:
        return True, C.parse_configs(text)
    except ValueError:
        return False, []


def test_parsers_agree_on_random_and_malformed_files(built, tmp_path):
    from dynamiccl.harness.simulator.tuner_abi import TunerPlugin

    rng = random.Random(7)
    n_ok = n_bad = 0
    conf = tmp_path / "t.conf"
    for i in range(300):
        text = C.format_configs(random_configs(rng, first=1 + rng.randrange(1000)))
        body = text[:text.rfind("# end ")]
        if i % 8 in (1, 2, 3, 5):      # a grammar edit, sealed again: the parsers must agree on the grammar
            text = seal(mutate(rng, body))
        elif i % 8 == 6:               # torn: cut anywhere (format 2 refuses every cut)
            text = text[:rng.randrange(len(text))]
        elif i % 8 == 7:               # format 1 (no format-2 header): no trailer needed
            text = mutate(rng, body.replace(C.HEADER, "# dynamiccl tuner config", 1))
        ok, cfgs = python_accepts(text)
        conf.write_bytes(text.encode("utf-8", "surrogatepass"))
        with TunerPlugin.private_copy(built["plugin"], tmp_dir=tmp_path) as p:   # a fresh process state
            p.configure(conf, mode="agree", poll_ms=0)
            rc = p.reload()
            assert (rc == 1) == ok, f"python {'accepts' if ok else 'rejects'}, C returns {rc} ({p.last_error()}):\n{text}"
            if ok:
                n_ok += 1
                assert p.staged_version == (cfgs[-1].version if cfgs else 0)
                assert p.oldest_version == (cfgs[0].version if cfgs else 0)
            else:
                n_bad += 1
    assert n_ok > 80 and n_bad > 80, (n_ok, n_bad)


def test_a_torn_format_2_file_is_refused_at_every_cut(built, tmp_path):
    """Issue 18 #8: a write torn at a line boundary was accepted as a version (and the full one then
    refused); with the end marker every strict prefix of a file is refused by both parsers."""
    from dynamiccl.harness.simulator.tuner_abi import TunerPlugin

    text = C.format_configs(random_configs(random.Random(3), first=5))
    conf = tmp_path / "t.conf"
    cuts = sorted({i for i, ch in enumerate(text) if ch == "\n"} | {1, len(C.HEADER), len(text) - 1})
    with TunerPlugin.private_copy(built["plugin"], tmp_dir=tmp_path) as p:
        p.configure(conf, mode="agree", poll_ms=0)
        conf.write_text(text)
        assert p.reload() == 1
        full = p.staged_version
        for cut in cuts:
            conf.write_text(text[:cut + 1] if cut + 1 < len(text) else text[:cut])
            assert not python_accepts(conf.read_text())[0], cut
            assert p.reload() == -1 and "torn file" in p.last_error(), (cut, p.last_error())
            assert p.staged_version == full          # the previous version is kept


@pytest.mark.parametrize("num_algo", [7, 6])
def test_getcollinfo_matches_apply_rule(private_plugin, num_algo):
    rng = random.Random(11 + num_algo)
    nrng = np.random.default_rng(num_algo)
    p = private_plugin("immediate")
    ctxs = {h: p.init(h, 16, 2) for h in COMMS}
    decided = untouched = chunks = 0
    version = 0
    for _ in range(40):
        version += 1
        cfg = TunerConfig(version, tuple(random_rule(rng) for _ in range(rng.randint(1, 30))))
        C.write_configs(p.conf, [cfg])
        assert p.reload() == 1 and p.applied_version == version, p.last_error()
        for _ in range(150):
            func = rng.choice(FUNCS)
            nbytes = rng.choice(BOUNDS[:-1]) + rng.choice((0, 0, 1, -1 if rng.random() < 0.5 else 7))
            nbytes = max(0, nbytes)
            comm = rng.choice(COMMS)
            table = nrng.uniform(1.0, 100.0, (num_algo, 3)).astype(np.float32)
            table[nrng.random((num_algo, 3)) < 0.3] = -1.0
            ref_t, ref_nch, ref_chunk = apply_rule_nccl(cfg, table, func, nbytes, comm)
            out, nch = p.get_coll_info(ctxs[comm], func, nbytes, table)
            np.testing.assert_array_equal(out, ref_t.astype(np.float32), err_msg=f"{func} {nbytes} {comm:#x} {cfg}")
            assert nch == ref_nch
            if (out == table).all():
                untouched += 1
                continue
            decided += 1
            a, pr = divmod(int(np.argmin(np.where(out >= 0, out, np.inf))), 3)
            chunk = p.get_chunk_size(ctxs[comm], func, nbytes, a, pr, nch, 524288)
            assert chunk == (chunk_for_proto(ref_chunk, pr) if ref_chunk else 524288), (func, nbytes, a, pr, cfg)
            chunks += ref_chunk > 0
    assert decided > 500 and untouched > 500 and chunks > 50, (decided, untouched, chunks)
    st = p.stats()
    assert st["decisions"] == decided and st["contexts"] == len(COMMS)


def test_minus_one_cells_are_never_revived(private_plugin):
    """Every cell a rule could pick is disabled: the table comes back unchanged, whatever the rule."""
    p = private_plugin("immediate")
    rules = tuple(Rule("AllReduce", 0, U64_MAX, a, pr, 8) for a in (*ALGOS, None) for pr in (*PROTOS, None))
    for v, r in enumerate(rules, 1):
        C.write_configs(p.conf, [TunerConfig(v, (r,))])
        assert p.reload() == 1
        ctx = p.init(1, 8, 1)
        table = np.full((7, 3), -1.0, dtype=np.float32)
        out, nch = p.get_coll_info(ctx, "AllReduce", 4096, table)
        assert (out == -1.0).all() and nch == 0
        p.finalize(ctx)
    assert p.stats()["no_enabled_cell"] == len(rules)


def test_limits_match_the_c_plugin(built):
    h = (built["plugin"].parent / "src" / "internal.h").read_text()

    def define(name: str) -> str:
        return next(ln.split(None, 2)[2].split("/*")[0].strip() for ln in h.splitlines()
                    if ln.startswith(f"#define {name} "))

    assert int(define("DCT_MAX_RULES")) == C.MAX_RULES
    assert int(define("DCT_MAX_VERSIONS")) == C.MAX_VERSIONS
    assert define("DCT_MAX_FILE_BYTES") == "(1 << 20)" and C.MAX_FILE_BYTES == 1 << 20
    assert C.DEFAULT_PATH.endswith(".conf")  # per-user rule, C and Python compared in tests/contracts


@pytest.mark.parametrize("algo,nnodes,applied", [
    ("RING", 2, True), ("NVLS_TREE", 2, True), ("NVLS", 1, True),    # NCCL clamps these budgets
    ("NVLS", 2, False), ("COLLNET_DIRECT", 2, False), ("COLLNET_CHAIN", 1, False),   # "collnet" tasks: not
])
def test_a_channel_budget_is_written_only_where_nccl_clamps_it(private_plugin, algo, nnodes, applied):
    """NCCL runs CollNet and multi-node NVLS as "collnet" tasks, whose budget it uses unclamped; everywhere
    else (NVLS_TREE included) it clamps the budget to the channels it built. C and Python agree."""
    p = private_plugin("immediate")
    C.write_configs(p.conf, [TunerConfig(1, (Rule("AllReduce", 0, U64_MAX, algo, "SIMPLE", 4),))])
    assert p.reload() == 1
    ctx = p.init(1, 8 * nnodes, nnodes)
    table = np.full((7, 3), 5.0, dtype=np.float32)
    out, nch = p.get_coll_info(ctx, "AllReduce", 1 << 20, table)
    assert out[ALGOS.index(algo), PROTOS.index("SIMPLE")] == 0.0 and nch == (4 if applied else 0)
    cfg = C.read_configs(p.conf)[-1]
    assert apply_rule(cfg, table, "AllReduce", 1 << 20, 1, n_nodes=nnodes)[1] == nch
    p.finalize(ctx)
