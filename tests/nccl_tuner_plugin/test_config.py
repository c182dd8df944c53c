"""dynamiccl.nccl_tuner_plugin.config: the file format's strict grammar, the epoch annotation, and the writer's
refusals that protect cross-rank consistency (a version number never reused, versions never going back)."""
from __future__ import annotations

import pytest

from dynamiccl.nccl_tuner_plugin.config import (MAX_VERSIONS, Rule, TunerConfig, format_configs, next_version, parse_configs,
                                      read_configs, write_configs)

R1 = Rule("AllReduce", 0, 65535, "RING", "LL", 8)
R2 = Rule("AllGather", 1 << 20, (1 << 64) - 1, None, "SIMPLE", 0, 0, 0x1F2E3D4C5B6A7988)


def test_round_trip_with_epoch():
    cfgs = [TunerConfig(4, (R1,)), TunerConfig(5, (R1, R2), apply_at_ns=1767225600123456789)]
    text = format_configs(cfgs)
    assert "version 5 at 1767225600123456789" in text
    assert parse_configs(text) == cfgs


@pytest.mark.parametrize("text, msg", [
    ("version 1\nAllReduce +1 2 RING LL 0 0 *\n", "decimal digits only"),
    ("version 1\nAllReduce 1_0 20 RING LL 0 0 *\n", "decimal digits only"),
    ("version 1\nAllReduce 0 2 RING LL 0 0 -1f\n", "communicator hash"),
    ("version 1\nAllReduce 0 2 RING LL 0 0 0x11112222333344445\n", "communicator hash"),
    ("version 1 at\n", "version N at T_NS"),
    ("version 1 AT 5\n", "version N at T_NS"),
    ("version 2\nversion 2\n", "strictly increasing"),
    ("".join(f"version {v}\n" for v in range(1, MAX_VERSIONS + 2)), "more than 8 versions"),
    ("version 1\n" + "AllReduce 0 1 RING LL 0 0 *  " * 50 + "\n", "longer than 1023"),
    ("version 1\n" + "".join(f"AllReduce {i} {i} * * 0 0 *\n" for i in range(257)), "more than 256 rules"),
])
def test_strict_grammar(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_configs(text)


def test_comment_does_not_count_towards_the_line_limit():
    assert parse_configs("version 1  # " + "x" * 5000 + "\n") == [TunerConfig(1)]


def test_writer_refuses_to_reuse_a_version_number(tmp_path):
    path = tmp_path / "t.conf"
    write_configs(path, [TunerConfig(1, (R1,))])
    write_configs(path, [TunerConfig(1, (R1,)), TunerConfig(2, (R2,))])     # same 1, new 2: fine
    with pytest.raises(ValueError, match="version 2 already exists .* other rules"):
        write_configs(path, [TunerConfig(2, (R1,))])
    with pytest.raises(ValueError, match="older than 2"):
        write_configs(path, [TunerConfig(1, (R1,))])
    assert [c.version for c in read_configs(path)] == [1, 2]                 # the refused writes changed nothing


def test_next_version(tmp_path):
    path = tmp_path / "t.conf"
    assert next_version(path) == 1
    write_configs(path, [TunerConfig(41, (R1,)), TunerConfig(42, (R2,))])
    assert next_version(path) == 43
    path.write_text("garbage\n")
    assert next_version(path) == 1


def test_hook_never_raises_when_the_plugin_refuses(private_plugin, caplog):
    """A plugin left in immediate mode refuses apply_version: the hook logs and returns, the job goes on."""
    from dynamiccl.nccl_tuner_plugin import sync

    p = private_plugin("immediate")
    write_configs(p.conf, [TunerConfig(3, (R1,))])
    p.reload()
    p.configure(mode="agree")
    p.apply_version(0)
    p.configure(mode="immediate")
    assert sync.run_ranks([p]) == [0] and "cannot apply tuner config version 3" in caplog.text
