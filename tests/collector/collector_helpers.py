"""Helpers for the collector tests (a unique module name: tests/ has no packages)."""
from __future__ import annotations

import os
import tempfile
import time

import pytest

from dynamiccl.collector.config import default_config


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
    d = tempfile.mkdtemp(prefix="dccl")
    yield os.path.join(d, "c.sock")


@pytest.fixture
def quiet_config(tmp_path):
    """No servers, no parquet: in-process only."""
    return default_config().replace(receiver={"listen": ()}, parquet={"directory": None},
                                    prometheus={"address": None}, features={"address": None})


def connect(addr: str):
    """A client socket to a listener's bound address (``unix:PATH`` or ``tcp:HOST:PORT``)."""
    import socket
    if addr.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(addr[5:])
        return s
    host, port = addr[4:].rsplit(":", 1)
    return socket.create_connection((host, int(port)))
