"""Grafana dashboards as code (build.py), their committed JSON (json/), push and annotations (grafana_push.py)."""
