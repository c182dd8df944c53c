"""Feature-stream lines: round trip, and lines from before a column was added keep decoding."""
from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from dynamiccl.collector.features import KEYS_DEFAULTS, KEYS_SCHEMA, WindowFeatures, decode_line, empty_ranks, encode_line


def _window(n: int) -> WindowFeatures:
    rng = np.random.default_rng(1)
    cols = {}
    for name, dt in KEYS_SCHEMA.items():
        if dt == pl.String:
            cols[name] = [f"{name}{i % 7}" for i in range(n)]
        elif dt.is_float():
            cols[name] = rng.random(n)
        else:
            cols[name] = rng.integers(1, 1000, n)
    return WindowFeatures(5.0, 1.0, pl.DataFrame(cols, schema=KEYS_SCHEMA), empty_ranks(), {"records": n})


def _old_line(wf: WindowFeatures) -> bytes:
    """The same window as a collector before ``tuner_config_version`` existed wrote it."""
    msg = json.loads(encode_line(wf))
    for c in KEYS_DEFAULTS:
        del msg["keys"][c]
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def test_round_trip_keeps_tuner_config_version():
    wf = _window(20)
    assert decode_line(encode_line(wf)).keys.equals(wf.keys)


@pytest.mark.parametrize("n", [3, 3000])  # 3000 rows: a line over 64 KiB takes the detector's fast path
def test_old_lines_decode_missing_version_as_0(n):
    from dynamiccl.detector.feature_decode import decode
    wf = _window(n)
    line = _old_line(wf)
    assert b"tuner_config_version" not in line and (n < 100 or len(line) > 1 << 16)
    want = wf.keys.with_columns(pl.lit(0, pl.UInt32).alias("tuner_config_version"))
    for got in (decode_line(line), decode(line)):
        assert dict(got.keys.schema) == KEYS_SCHEMA
        assert got.keys.equals(want)


def test_unknown_or_other_missing_columns_still_rejected_by_fast_path():
    from dynamiccl.detector.feature_decode import _fast
    msg = json.loads(_old_line(_window(3000)))
    del msg["keys"]["lat_p50_s"]
    with pytest.raises(ValueError, match="unexpected columns"):
        _fast(json.dumps(msg).encode())
