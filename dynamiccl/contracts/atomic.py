"""One atomic file replace: readers see the old file or the new one, never a partial one."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: str | os.PathLike, data: str | bytes, *, fsync: bool = True, mode: int | None = None) -> None:
    """Write ``data`` to a temporary file in ``path``'s directory, fsync it, then rename it over ``path``.

    The temporary file is removed when anything fails (the old file stays). ``mode`` sets the new file's
    permissions (default: ``mkstemp``'s 0600).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.conf"
    >>> atomic_write(p, "a\\n"); atomic_write(p, b"b\\n"); p.read_text()
    'b\\n'
    """
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
