"""Processors: event-time window aggregation."""
