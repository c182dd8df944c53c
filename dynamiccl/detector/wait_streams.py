"""Wait streams in the stream table: the window's ``waits`` rows (collector/processors/wait.py) as streams of
their own.

A wait row's stream is its collective's name with ``WAIT_SUFFIX`` (``AllReduce:wait``): a stream never
switches between durations and waits (a job whose records turn untimed ends its duration stream and starts a
wait stream, instead of reading as a change), and the change names the wait in its ``funcs``, its streams'
evidence (``"timing": "wait"``) and ``evidence["timing"]``. The detector monitors them like any other stream;
the rank that arrives last waits least, so the straggler rule (the rank with the most shortest values) names
it from the ranks frame's ``shortest_count``, which the collector gives the waits' votes.
"""
from __future__ import annotations

import polars as pl

__all__ = ["WAIT_SUFFIX", "with_wait_rows", "is_wait", "timing_of"]

WAIT_SUFFIX = ":wait"


def with_wait_rows(keys: pl.DataFrame, waits: pl.DataFrame | None) -> pl.DataFrame:
    """``keys`` with the wait rows appended under their own stream names (columns one lacks are null)."""
    if waits is None or waits.height == 0:
        return keys
    w = waits.with_columns((pl.col("func") + WAIT_SUFFIX).alias("func"))
    if keys.height == 0:
        return w
    return pl.concat([keys, w], how="diagonal_relaxed")


def is_wait(func: str) -> bool:
    return func.endswith(WAIT_SUFFIX)


def timing_of(funcs: list[str]) -> str | None:
    """``"wait"`` when every stream is a wait stream, ``"mixed"`` when some are, None when none is.

    >>> timing_of(["AllReduce:wait"]), timing_of(["AllReduce", "AllReduce:wait"]), timing_of(["AllReduce"])
    ('wait', 'mixed', None)
    """
    n = sum(is_wait(f) for f in funcs)
    return None if n == 0 else "wait" if n == len(funcs) else "mixed"
