"""One atomic file replace: readers see the old file or the new one, never a partial one."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: str | os.PathLike, data: str | bytes, *, fsync: bool = True, mode: int | None = None) -> None:
    """Write ``data`` to a temporary file in ``path``'s directory, fsync it, then rename it over ``path``.

    The temporary name is unique per call (pid + random), so concurrent writers never share one; it is removed
    when anything fails, and the old file stays. The new file gets ``open()``'s permissions (0666 less the
    umask) unless ``mode`` is given.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.conf"
    >>> atomic_write(p, "a\\n"); atomic_write(p, b"b\\n"); p.read_text(), [f.name for f in p.parent.iterdir()]
    ('b\\n', ['x.conf'])
    """
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)     # exactly ``mode``, whatever the umask
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
