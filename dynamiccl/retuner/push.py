"""Writes the tuner config file the plugin reloads: versioned, atomic, last good config kept.

:class:`ConfigPusher` keeps the newest ``MAX_VERSIONS`` configs and rewrites the whole file on every push
with :func:`dynamiccl.nccl_tuner_plugin.config.write_configs` (temporary file + fsync + rename), so the plugin reads
the old file or the new one, never a partial one — also when the retuner dies mid-push. A push that fails
(unwritable directory, too many rules) leaves the file as it was: the job keeps running on the last good
version, the error is counted (``dynamiccl_retuner_push_errors_total{reason}``) and written to the audit log.

On start-up the pusher reads an existing file and continues its version numbers; a malformed file is
reported and the next version starts above the wall-clock seconds, so it still supersedes anything the
plugin has staged. In dry-run the pusher writes nothing.

>>> import tempfile, os
>>> from dynamiccl.nccl_tuner_plugin.config import Rule, read_configs
>>> p = os.path.join(tempfile.mkdtemp(), "tuner.conf")
>>> pu = ConfigPusher(p, dry_run=False)
>>> pu.push([Rule("AllReduce", 0, 65535, "RING", "LL", 4)]), pu.push([])
(1, 2)
>>> [c.version for c in read_configs(p)], ConfigPusher(p, dry_run=False).version
([1, 2], 2)
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Sequence

from dynamiccl.contracts.runtime_paths import UnsafeDirectory, ensure_private_dir, runtime_dir
from dynamiccl.nccl_tuner_plugin.config import MAX_RULES, MAX_VERSIONS, Rule, TunerConfig, read_configs, write_configs

__all__ = ["ConfigPusher", "PushError"]

log = logging.getLogger("dynamiccl.retuner.push")


class PushError(RuntimeError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ConfigPusher:
    def __init__(self, path: str | os.PathLike, *, dry_run: bool = True, keep: int = MAX_VERSIONS,
                 clock: Callable[[], float] = time.time) -> None:
        if not 1 <= keep <= MAX_VERSIONS:
            raise ValueError(f"keep must be in [1, {MAX_VERSIONS}]")
        self.path = os.fspath(path)
        self.dry_run = dry_run
        self.keep = keep
        self.clock = clock
        self.history: list[TunerConfig] = []
        self.version = 0
        self.load_error: str | None = None
        self.last_error: str | None = None
        if os.path.exists(self.path):
            try:
                self.history = read_configs(self.path)[-keep:]
                self.version = self.history[-1].version if self.history else 0
            except (ValueError, OSError, UnicodeDecodeError) as e:
                self.load_error = f"existing tuner config unreadable, starting a new version series: {e}"
                log.error("%s", self.load_error)
                self.history = []
                self.version = int(self.clock())

    @property
    def current(self) -> TunerConfig | None:
        return self.history[-1] if self.history else None

    def push(self, rules: Sequence[Rule]) -> int | None:
        """Write a new version holding ``rules``; returns it (None in dry-run). Raises :class:`PushError`."""
        if self.dry_run:
            return None
        if len(rules) > MAX_RULES:
            raise PushError("too_many_rules", f"{len(rules)} rules, the plugin holds at most {MAX_RULES}")
        try:
            cfg = TunerConfig(self.version + 1, tuple(rules))
        except ValueError as e:
            raise PushError("invalid_config", str(e)) from None
        hist = (self.history + [cfg])[-self.keep:]
        try:
            if os.path.dirname(os.path.abspath(self.path)) == runtime_dir():
                ensure_private_dir(runtime_dir())  # the default: created 0700, refused if another user's
            write_configs(self.path, hist)
        except UnsafeDirectory as e:
            self.last_error = str(e)
            raise PushError("write_failed", self.last_error) from None
        except OSError as e:
            self.last_error = f"{self.path}: {e.strerror or e}"
            raise PushError("write_failed", self.last_error) from None
        self.history = hist
        self.version = cfg.version
        return cfg.version
