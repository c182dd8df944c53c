"""Moved to :mod:`dynamiccl.nccl_model.cost_model` (product code the retuner imports); this name stays an alias.

``import dynamiccl.harness.simulator.cost_model`` yields that very module object, so attribute access and monkeypatching behave as before.
"""
import sys

from dynamiccl.nccl_model import cost_model as _module

sys.modules[__name__] = _module
