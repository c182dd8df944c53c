"""Exporters: Prometheus /metrics, parquet history, feature stream."""
