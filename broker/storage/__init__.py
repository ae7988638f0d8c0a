"""Node storage: shared WAL, per-group segments, snapshots. The only package touching files."""
