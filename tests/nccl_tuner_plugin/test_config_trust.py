"""The tuner reads only a config its job's user (or root) owns and nobody else can write; an empty
file (a truncate-then-crash) is an error that keeps the last version, not "no config"."""
from __future__ import annotations

import os

from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, write_configs


def _good(p, v=1):
    write_configs(p.conf, [TunerConfig(v, (Rule("AllReduce", 0, 1 << 30, "RING", "LL", 2),))])
    os.chmod(p.conf, 0o600)
    p.reload()
    assert p.staged_version == v


def test_empty_file_keeps_the_last_version(private_plugin):
    p = private_plugin("immediate")
    _good(p)
    p.conf.write_text("")                  # before: taken as "no config"
    p.reload()
    assert p.staged_version == 1 and "empty" in p.last_error()


def test_config_writable_by_others_is_refused(private_plugin):
    p = private_plugin("immediate")
    _good(p)
    write_configs(p.conf, [TunerConfig(2, (Rule("AllReduce", 0, 1 << 30, "TREE", "LL", 1),))])
    os.chmod(p.conf, 0o666)                 # anyone could have planted this
    p.reload()
    assert p.staged_version == 1 and "writable by group or others" in p.last_error()


def test_config_owned_by_another_user_is_refused(private_plugin):
    if os.geteuid() != 0:
        import pytest
        pytest.skip("needs root to give a file to another user")
    p = private_plugin("immediate")
    _good(p)
    write_configs(p.conf, [TunerConfig(2, (Rule("AllReduce", 0, 1 << 30, "TREE", "LL", 1),))])
    os.chmod(p.conf, 0o600)
    os.chown(p.conf, 12345, 12345)
    # the plugin compares with its own euid: as root, any owner but root and itself is refused
    p.reload()
    assert p.staged_version == 1 and "owned by uid 12345" in p.last_error()
