"""Prometheus metrics of the servers: the exporter (an HTTP endpoint on the server's own
event loop) and the request metrics every server keeps; each server adds its own collector
(broker/metrics.py, namesrv/metrics.py). Metric names and meanings: docs/monitoring.md.
"""
