"""In-process source: other components (a simulator, a torch.distributed source) push records
straight into the pipeline instead of going through a socket.

>>> from dynamiccl.harness.collector_testing import SinkConsumer, synthetic_events
>>> sink = SinkConsumer()
>>> src = Source(lambda batch, block: sink.consume(batch) or len(batch))
>>> src.push(synthetic_events(3, nranks=2), host="h0", job_id="j1", comm_names={})
6
>>> len(sink.items[0].events), sink.items[0].host
(6, 'h0')
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.wire_format import EVENT_DTYPE

__all__ = ["Source"]


class Source:
    """``push(records, host=, job_id=, comm_names=)`` → records accepted (after validation).

    ``ingest(batch, block)`` is the pipeline's entry point; with ``block=False`` (default) a full
    queue drops the batch and counts it (reason ``queue_full``); ``block=True`` waits for room.
    """

    def __init__(self, ingest: Callable[..., int]):
        self._ingest = ingest

    def push(self, records: np.ndarray, *, host: str, job_id: str,
             comm_names: Mapping[int, str] | None = None, block: bool = False) -> int:
        if not isinstance(records, np.ndarray) or records.dtype != EVENT_DTYPE:
            raise TypeError("records must be a numpy array of dynamiccl.collector.wire_format.EVENT_DTYPE")
        if len(records) == 0:
            return 0
        batch = RecordBatch(np.ascontiguousarray(records), str(host), str(job_id), dict(comm_names or {}))
        return self._ingest(batch, block=block)
