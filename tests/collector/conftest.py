"""Shared helpers for collector tests: small pipelines on ephemeral ports/paths."""
from __future__ import annotations

import socket
import time

import pytest

from collector.config import default_config


def wait_until(pred, timeout=10.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


@pytest.fixture
def sock_path(tmp_path_factory):
    # short path: AF_UNIX paths are limited to 107 bytes
    import tempfile, os
    d = tempfile.mkdtemp(prefix="dccl")
    yield os.path.join(d, "c.sock")


@pytest.fixture
def quiet_config(tmp_path):
    """No servers, no parquet: in-process only."""
    return default_config().replace(receiver={"listen": ()}, parquet={"directory": None},
                                    prometheus={"address": None}, features={"address": None})


def send_all(address_kind, target, data: bytes, close=True):
    s = socket.socket(socket.AF_UNIX if address_kind == "unix" else socket.AF_INET, socket.SOCK_STREAM)
    s.connect(target)
    s.sendall(data)
    if close:
        s.close()
        return None
    return s
