"""What the stages agree on: names, sizes, addresses, file formats and stream handling.

Every stage (collector, detector, retuner, the plugins' Python side) and the harness import these instead of
keeping their own copies. This package imports nothing first-party (``tests/test_layering.py`` checks it) and
nothing third-party, so a training node can import it without the services' dependencies.

* :mod:`.collectives` — collectives/algorithms/protocols (wire code, tuner token, cost-model index, P2P flag,
  busbw factor) and the size bucket.
* :mod:`.addresses` — default service addresses and ports.
* :mod:`.tuner_file` — the tuner config file's format constants.
* :mod:`.atomic` — :func:`atomic_write`.
* :mod:`.lines` — the linear-time, bounded, reconnecting NDJSON line reader.
"""
from __future__ import annotations

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.contracts.collectives import (ALGOS, COLLECTIVES, FUNCS, PROTOS, TUNER_FUNCS, Collective,
                                             bucket_range, busbw_factor, collective, size_bucket, tuner_token)
from dynamiccl.contracts.lines import LineSplitter, follow, socket_lines

__all__ = ["ALGOS", "COLLECTIVES", "FUNCS", "PROTOS", "TUNER_FUNCS", "Collective", "bucket_range",
           "busbw_factor", "collective", "size_bucket", "tuner_token", "atomic_write", "LineSplitter",
           "follow", "socket_lines"]
