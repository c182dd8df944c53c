"""Receivers: plugin stream (Unix/TCP), parquet replay, in-process source."""
