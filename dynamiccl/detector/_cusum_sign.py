"""`CUSUM`'s sign gate (``sign_gate``, default True): in a positive series, a value <= 0 is a
failed measurement.

Latencies, round-trip times and rates cannot be zero or negative; monitoring tools record a
failed measurement as a sentinel such as 0, -1 or (RIPE Atlas pings) -3 / -4. Accepted as data,
a run of them is extreme in one direction: the CUSUM winsorises it and alarms on its third value
(on the RTT development traces, runs of 4-8 failed pings started 14 false alarms).

Rule: once a baseline puts zero beyond the extreme limit below its level (level > ``z_clip`` x
scale) on a stream that has never accepted a value <= 0, values <= 0 are invalid: counted in
`n_invalid` and skipped, as below ``min_value``. Nothing changes for the values the chart judges:
a value <= 0 on such a baseline is extreme anyway (held, dropped or winsorised). A signed series,
or one whose values have reached 0 before the gate engaged, keeps them for good (the gate never
engages on it).
"""

from __future__ import annotations


def zero_is_extreme(level: float, scale: float, clip: float) -> bool:
    """Whether 0 lies beyond the extreme limit (``clip`` scales) below a positive ``level``."""
    return level > clip * scale


def validate_sign_gate(sign_gate) -> bool:
    """Check the sign gate's switch."""
    if not isinstance(sign_gate, bool):
        raise ValueError(f"sign_gate must be True or False, got {sign_gate!r}")
    return sign_gate
