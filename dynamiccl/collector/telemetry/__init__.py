"""Host telemetry exported by the collector (GPU: gpu.py, NVML via nvidia-ml-py)."""
