"""Real NCCL on a real GPU: ``dynamiccl validate-nccl`` (docs/real-nccl.md).

Starts N ranks on the NCCL backend with DynamICCL's profiler and tuner plugins loaded and a
collector in process, then checks the versions NCCL loaded, the records against CUDA-event timings
and NCCL's own TUNING log, the tuner's control and cross-rank switching, the plugins' overhead,
delivery, and that the detector sees a slowed rank. Standard library, numpy and torch only on
that path (the detector check runs when the services' libraries are installed).
"""
from __future__ import annotations


def register(sub):
    from .cli import register as _register
    _register(sub)
