"""DynamICCL: observability and anomaly-triggered retuning for NCCL collectives."""
from __future__ import annotations

from dynamiccl.contracts.version import __version__

__all__ = ["__version__"]
