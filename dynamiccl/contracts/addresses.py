"""Default addresses of the services: one place, so a stage and its consumer never disagree on a port.

``unix:PATH`` / ``tcp:HOST:PORT`` are stream addresses; ``HOST:PORT`` is an HTTP listen address.
"""
from __future__ import annotations

from dynamiccl.contracts.runtime_paths import default_socket

__all__ = ["COLLECTOR_LISTEN", "COLLECTOR_METRICS", "COLLECTOR_FEATURES", "DETECTOR_METRICS",
           "DETECTOR_EVENTS", "RETUNER_METRICS", "ALERT_LOG", "PORTS"]

COLLECTOR_LISTEN = f"unix:{default_socket()}"     # where the plugins send records: per user and job (runtime_paths)
COLLECTOR_METRICS = "127.0.0.1:9464"               # collector /metrics
COLLECTOR_FEATURES = "tcp:127.0.0.1:9465"          # collector window-features stream (NDJSON)
DETECTOR_METRICS = "127.0.0.1:9466"                # detector /metrics
DETECTOR_EVENTS = "tcp:127.0.0.1:9467"             # detector regime-change stream (NDJSON)
RETUNER_METRICS = "127.0.0.1:9468"                 # retuner /metrics
ALERT_LOG = "127.0.0.1:9469"                       # example Alertmanager webhook

#: service name -> default TCP port (the stack's and compose's port table)
PORTS = {"collector": 9464, "collector-features": 9465, "detector": 9466, "detector-events": 9467,
         "retuner": 9468, "alert-log": 9469, "collector-plugin": 9470}
