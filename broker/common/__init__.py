"""Small shared definitions used by every layer (no I/O, no dependencies)."""
