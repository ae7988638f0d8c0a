"""Suite-wide settings: hypothesis is derandomized (seeded) so every CI run is
reproducible; no deadlines, since the 2-core CI machine is shared."""
from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci")
