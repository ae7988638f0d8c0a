"""PySpark audit of quorum-queue segment disk usage (docs/AUDIT.md).

Modules: `formats` (decode segment/WAL/snapshot headers and indexes),
`io` (discover and parse data directories in parallel, fetch management API
manifests, write outputs and history), `transforms` (pure DataFrame ->
DataFrame arithmetic), `report` (console table, HTML with charts), `audit`
(the `python -m spark.audit` entry point).
"""
