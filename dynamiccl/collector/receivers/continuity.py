"""Loss across a collector restart: records a plugin sent on connections this collector never served.

The plugin opens every connection with PROCESS, COMM and one STATS record whose ``reserved[0]`` is the
connection's ordinal (1, 2, … per process) and whose ``records_sent`` counts what it sent on the earlier
connections. A process first seen here on a connection with ordinal > 1 has talked to another collector
(this one restarted, or the plugin was redirected): what it sent there was either stored by that collector
or lost with it (a SIGKILL loses its open windows). This collector cannot tell which, so it counts them
as *unconfirmed* (``dynamiccl_collector_records_unconfirmed_total``) and logs one rate-limited line;
records lost on connections this collector did serve show as ``record_seq`` jumps (``GapTracker``).
"""
from __future__ import annotations

from collections import OrderedDict

__all__ = ["RestartLedger"]


class RestartLedger:
    """Processes seen here (bounded LRU) and the unconfirmed count of each first sighting."""

    def __init__(self, max_processes: int = 65536):
        self._seen: OrderedDict[tuple, None] = OrderedDict()
        self.max_processes = max(1, max_processes)

    def observe(self, process: tuple, conn_ordinal: int, records_sent: int) -> int:
        """A STATS record of ``process``; returns the records sent before this collector saw it (0 if none)."""
        if process in self._seen:
            self._seen.move_to_end(process)
            return 0
        self._seen[process] = None
        while len(self._seen) > self.max_processes:
            self._seen.popitem(last=False)
        return records_sent if conn_ordinal > 1 else 0
