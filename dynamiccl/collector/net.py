"""Listening sockets for ``unix:PATH`` / ``tcp:HOST:PORT`` addresses (receivers, feature server)."""
from __future__ import annotations

import errno
import os
import socket
import stat

from dynamiccl.collector.config import parse_address
from dynamiccl.contracts.runtime_paths import UnsafeDirectory, ensure_private_dir, runtime_dir

__all__ = ["listen", "close_listener", "display"]


def display(kind: str, target) -> str:
    if kind == "unix":
        return f"unix:{target}"
    host, port = target[:2]
    return f"tcp:[{host}]:{port}" if ":" in host else f"tcp:{host}:{port}"


def _remove_stale_unix(path: str) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
    if st.st_uid != os.geteuid():  # in a shared directory, another user may be squatting the name
        raise OSError(errno.EEXIST, f"{path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()}): "
                                    "another user's socket; use a socket in a directory only you can write")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(0.5)
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)  # stale socket left by a dead process
        return
    except OSError:
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"{path}: another process is listening on this socket")


def _private_parent(path: str) -> None:
    """The per-user default directory is created 0700 and refused if another user could write it."""
    if os.path.dirname(os.path.abspath(path)) != runtime_dir():
        return
    try:
        ensure_private_dir(runtime_dir())
    except UnsafeDirectory as exc:
        raise OSError(errno.EPERM, str(exc)) from None


def listen(address: str, *, key: str, backlog: int = 128) -> tuple[socket.socket, str, str]:
    """Bind and listen (non-blocking). Returns (socket, transport, bound address for display).

    Raises ValueError for a malformed address and OSError (with the address in the message) if
    it cannot be bound."""
    kind, target = parse_address(address, key=key)
    try:
        if kind == "unix":
            _private_parent(target)
            _remove_stale_unix(target)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(target)
            except OSError:
                sock.close()
                raise
            bound = display("unix", target)
        else:
            host, port = target
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(sockaddr)
            except OSError:
                sock.close()
                raise
            bound = display("tcp", sock.getsockname())
        sock.listen(backlog)
        sock.setblocking(False)
        return sock, kind, bound
    except OSError as exc:
        raise OSError(exc.errno, f"{key} {address}: cannot listen: {exc.strerror or exc}") from exc
    except socket.gaierror as exc:  # pragma: no cover - subclass of OSError on 3.11
        raise OSError(errno.EINVAL, f"{key} {address}: {exc}") from exc


def close_listener(listener: socket.socket | None, kind: str | None, address: str | None) -> None:
    """Close a socket from :func:`listen` and remove its Unix socket file (the pair every server's
    shutdown needs)."""
    if listener is None:
        return
    listener.close()
    if kind == "unix" and address:
        try:
            os.unlink(address[5:])
        except OSError:
            pass
