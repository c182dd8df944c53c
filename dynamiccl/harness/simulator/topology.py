"""Moved to :mod:`dynamiccl.nccl_model.topology` (product code the retuner imports); this name stays an alias.

``import dynamiccl.harness.simulator.topology`` yields that very module object, so attribute access and monkeypatching behave as before.
"""
import sys

from dynamiccl.nccl_model import topology as _module

sys.modules[__name__] = _module
