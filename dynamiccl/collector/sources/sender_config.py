"""The sender's settings (``SenderConfig``): the plugin's environment variables, validated at start-up."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from dynamiccl.collector.auth import sender_token
from dynamiccl.collector.config import parse_address
from dynamiccl.contracts.runtime_paths import default_socket, runtime_dir

__all__ = ["SenderConfig", "env_int", "job_id_from_env"]


def job_id_from_env(env=os.environ) -> str:
    """DYNAMICCL_JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID, else ``unknown`` (as the plugin)."""
    for var in ("DYNAMICCL_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        if env.get(var):
            return env[var]
    return "unknown"


def env_int(env, name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw, 0)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw!r}") from None


@dataclass(frozen=True)
class SenderConfig:
    """Where and how to send. ``from_env()`` reads the plugin's variables (plugin README)."""
    collector: str = field(default_factory=lambda: f"unix:{default_socket()}")  # DYNAMICCL_COLLECTOR: unix:PATH or tcp:HOST:PORT
    host: str = ""                    # DYNAMICCL_HOST, else gethostname()
    job_id: str = ""                  # DYNAMICCL_JOB_ID / SLURM_JOB_ID / TORCHELASTIC_RUN_ID
    queue_size: int = 65536           # DYNAMICCL_RING_SIZE: records waiting for the sender
    flush_ms: int = 100               # DYNAMICCL_FLUSH_MS: sender wake-up interval
    send_timeout_s: float = 1.0       # bound on one frame write; then the connection is dropped
    connect_timeout_s: float = 0.5
    stats_interval_s: float = 1.0
    reconnect_min_s: float = 0.1
    reconnect_max_s: float = 5.0
    # DYNAMICCL_TOKEN_FILE / DYNAMICCL_TOKEN: sent in the auth preamble (dynamiccl/collector/auth.py); never printed
    token: str | None = field(default=None, repr=False)
    # the per-user runtime directory: a Unix socket inside it is used only while it is private
    private_dir: str = field(default_factory=runtime_dir)

    @classmethod
    def from_env(cls, env=os.environ, **overrides) -> "SenderConfig":
        values = dict(
            collector=env.get("DYNAMICCL_COLLECTOR") or f"unix:{default_socket(env)}",
            host=env.get("DYNAMICCL_HOST") or socket.gethostname(),
            job_id=job_id_from_env(env),
            queue_size=env_int(env, "DYNAMICCL_RING_SIZE", cls.queue_size),
            flush_ms=env_int(env, "DYNAMICCL_FLUSH_MS", cls.flush_ms),
            token=sender_token(env),
            private_dir=runtime_dir(env),
        )
        values.update(overrides)
        return cls(**values).validate()

    def validate(self) -> "SenderConfig":
        parse_address(self.collector, key="DYNAMICCL_COLLECTOR")
        for name in ("queue_size", "flush_ms"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be an integer > 0, got {v!r}")
        for name in ("send_timeout_s", "connect_timeout_s", "stats_interval_s", "reconnect_min_s",
                     "reconnect_max_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"{name} must be > 0, got {v!r}")
        if len(self.host.encode()) > 55 or len(self.job_id.encode()) > 47:
            raise ValueError("host must fit 55 bytes and job_id 47 bytes (PROCESS record)")
        return self
