"""Management HTTP API (aiohttp), Prometheus metrics and health checks."""
