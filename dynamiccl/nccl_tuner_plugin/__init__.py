"""DynamICCL's NCCL tuner plugin (C) and its plumbing.

* :mod:`dynamiccl.nccl_tuner_plugin.config` — the config file the retuner writes and the plugin reloads;
  :func:`~dynamiccl.nccl_tuner_plugin.config.apply_rule` is the reference semantics of the plugin.
* :mod:`dynamiccl.nccl_tuner_plugin.sync` — the one-line agreement hook for training scripts
  (``dynamiccl.nccl_tuner_plugin.sync.agree()`` at a step boundary).
* :func:`library_path` — the built ``libnccl-tuner-dynamiccl.so``; point NCCL at it with
  ``export NCCL_TUNER_PLUGIN=$(dynamiccl plugins --tuner)``.
"""
from __future__ import annotations

import os
from pathlib import Path

from dynamiccl.contracts.runtime_paths import default_tuner_config
from dynamiccl.contracts.tuner_file import DEFAULT_PATH as DEFAULT_CONFIG_PATH
from dynamiccl.contracts.tuner_file import ENV_VAR as CONFIG_ENV

__all__ = ["LIBRARY_NAME", "library_path", "CONFIG_ENV", "DEFAULT_CONFIG_PATH", "config_path"]

LIBRARY_NAME = "libnccl-tuner-dynamiccl.so"


def library_path() -> Path:
    """Return the path of the built tuner plugin.

    ``DYNAMICCL_TUNER_LIB`` overrides the location. Raises ``FileNotFoundError`` with the command
    that builds it when the library is missing (e.g. a source checkout never built).
    """
    override = os.environ.get("DYNAMICCL_TUNER_LIB")
    path = Path(override) if override else Path(__file__).with_name(LIBRARY_NAME)
    if not path.is_file():
        raise FileNotFoundError(
            f"tuner plugin not found at {path}; build it with "
            f"`make -C {Path(__file__).parent}` or reinstall with `pip install .`")
    return path


def config_path() -> Path:
    """The config file the plugin reads: ``$DYNAMICCL_TUNER_CONFIG`` or the per-user default (:mod:`dynamiccl.contracts.runtime_paths`)."""
    return Path(os.environ.get(CONFIG_ENV) or default_tuner_config())
