"""Placeholder package: see the open issue for this pipeline role."""
