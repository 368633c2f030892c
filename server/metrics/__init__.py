"""What ``GET /metrics`` exposes, built at scrape time from the database: jobs (:mod:`server.metrics.exporter`)
and workers (:mod:`server.metrics.worker_metrics`).
"""
