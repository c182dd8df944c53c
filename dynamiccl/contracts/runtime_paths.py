"""Per-user, per-job default paths for the record socket and the tuner config.

The rule (mirrored in C by ``dynamiccl/contracts/dynamiccl_paths.h``; a test checks both agree):

* directory: ``$XDG_RUNTIME_DIR/dynamiccl`` when ``XDG_RUNTIME_DIR`` is an absolute path, else
  ``/tmp/dynamiccl-<uid>``. It must be a real directory (not a link) owned by the user and not
  writable by group or others; another user could otherwise squat the socket or plant a config.
* job id: ``DYNAMICCL_JOB_ID``, else ``SLURM_JOB_ID``; only ``[A-Za-z0-9._-]``, at most 64 chars
  (anything else is ignored: it would otherwise reach a file name).
* names: ``collector.sock`` / ``tuner.conf`` with no job id, ``collector-<job>.sock`` /
  ``tuner-<job>.conf`` with one.

Services create the directory (0700) before they bind or write; readers only check it.
"""
from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping

__all__ = ["JOB_ENV_VARS", "UnsafeDirectory", "job_id", "runtime_dir", "default_socket",
           "default_tuner_config", "check_private_dir", "ensure_private_dir"]

JOB_ENV_VARS = ("DYNAMICCL_JOB_ID", "SLURM_JOB_ID")   # first non-empty valid one wins
_JOB_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


class UnsafeDirectory(RuntimeError):
    """The runtime directory exists but another user could write into it."""


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def job_id(env: Mapping[str, str] | None = None) -> str | None:
    """The job id used in default names, or ``None``."""
    e = _env(env)
    for var in JOB_ENV_VARS:
        value = e.get(var, "")
        if _JOB_RE.fullmatch(value) and value not in (".", ".."):
            return value
    return None


def runtime_dir(env: Mapping[str, str] | None = None, uid: int | None = None) -> str:
    """``$XDG_RUNTIME_DIR/dynamiccl`` or ``/tmp/dynamiccl-<uid>``."""
    xdg = _env(env).get("XDG_RUNTIME_DIR", "")
    if xdg.startswith("/"):
        return xdg.rstrip("/") + "/dynamiccl"
    return f"/tmp/dynamiccl-{os.getuid() if uid is None else uid}"


def _name(stem: str, ext: str, env: Mapping[str, str] | None) -> str:
    job = job_id(env)
    return f"{stem}-{job}.{ext}" if job else f"{stem}.{ext}"


def default_socket(env: Mapping[str, str] | None = None, uid: int | None = None) -> str:
    """The collector's default Unix socket path."""
    return f"{runtime_dir(env, uid)}/{_name('collector', 'sock', env)}"


def default_tuner_config(env: Mapping[str, str] | None = None, uid: int | None = None) -> str:
    """The tuner config file's default path."""
    return f"{runtime_dir(env, uid)}/{_name('tuner', 'conf', env)}"


def check_private_dir(path: str, uid: int | None = None) -> None:
    """Raise :class:`UnsafeDirectory` unless ``path`` is a directory owned by ``uid``, mode 0700-ish."""
    uid = os.getuid() if uid is None else uid
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory (a link or a file); refusing to use it")
    if st.st_uid != uid:
        raise UnsafeDirectory(f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid}); "
                              "another user may have created it: remove it or set the path explicitly")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectory(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                              "run `chmod 700` on it or set the path explicitly")


def ensure_private_dir(path: str, uid: int | None = None) -> str:
    """Create ``path`` with mode 0700 if missing, then :func:`check_private_dir` it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path, uid)
    return path
