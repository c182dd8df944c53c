"""DynamICCL: observability and anomaly-triggered retuning for NCCL collectives."""
from __future__ import annotations

__version__ = "0.1.0"
