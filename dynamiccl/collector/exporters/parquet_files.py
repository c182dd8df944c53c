"""Part-file paths of the parquet history: partition values, the start-up write probe, one part file's state."""
from __future__ import annotations

import os
import re

__all__ = ["PartFile", "check_writable", "safe_partition_value"]


def safe_partition_value(value: str) -> str:
    """A directory-safe rendering of a partition value (the exact value is in the file).

    >>> safe_partition_value("job/../x y")
    'job_.._x_y'
    """
    s = re.sub(r"[^A-Za-z0-9._-]", "_", value)[:100]
    return s if s not in ("", ".", "..") else "_"


def check_writable(directory: str) -> None:
    """Create ``directory`` and write a probe file in it: a read-only history directory is a
    start-up error (OSError naming it), not rows silently lost later."""
    probe = os.path.join(directory, f".write-probe-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"x")
            os.fsync(f.fileno())
        os.unlink(probe)
    except OSError as exc:
        raise OSError(exc.errno, f"parquet directory {directory}: cannot write: {exc.strerror or exc}") from exc


class PartFile:
    """One part file: ``rows`` given to it so far, ``sent`` of them handed to the writer."""
    __slots__ = ("id", "key", "job_id", "tmp", "path", "since", "rows", "sent")

    def __init__(self, file_id: int, path: str, *, key, job_id: str, since: float):
        self.key, self.job_id, self.since = key, job_id, since
        self.rows = self.sent = 0
        self.rename(file_id, path)

    def rename(self, file_id: int, path: str) -> None:
        self.id, self.path = file_id, path
        self.tmp = f"{path}.tmp.{os.getpid()}"
